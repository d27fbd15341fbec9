//! List semantics for server-side apply: which lists are atomic, sets
//! (`x-kubernetes-list-type: set`) or maps keyed by fields
//! (`x-kubernetes-list-type: map` + `x-kubernetes-list-map-keys`), from the CRD
//! schema or, for built-in fields, from the upstream API definitions; and the
//! path segments that name one list element (`v:<value>` / `k:<keys>` in `FieldsV1`).

use serde_json::{Map, Value};

/// Marks a path segment as a list element rather than a field name.
const ELEMENT: char = '\u{1}';

/// How a list merges under server-side apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListKind {
    /// Owned and replaced as a whole.
    Atomic,
    /// Elements are scalars owned one by one.
    Set,
    /// Elements are objects identified by these key fields.
    Map(Vec<String>),
}

/// Whether a path segment names a list element.
pub fn is_element(seg: &str) -> bool {
    seg.starts_with(ELEMENT)
}

/// The segment naming `item` in a list of this kind (`None` for atomic lists
/// or items without their keys).
pub fn element_segment(kind: &ListKind, item: &Value) -> Option<String> {
    match kind {
        ListKind::Atomic => None,
        ListKind::Set => Some(format!("{ELEMENT}v:{item}")),
        ListKind::Map(keys) => {
            let obj = item.as_object()?;
            let mut k = Map::new();
            for key in keys {
                k.insert(key.clone(), obj.get(key)?.clone());
            }
            Some(format!("{ELEMENT}k:{}", Value::Object(k)))
        }
    }
}

enum Element {
    Value(Value),
    Keys(Map<String, Value>),
}

fn parse(seg: &str) -> Option<Element> {
    let rest = seg.strip_prefix(ELEMENT)?;
    if let Some(v) = rest.strip_prefix("v:") {
        return serde_json::from_str(v).ok().map(Element::Value);
    }
    let k = rest.strip_prefix("k:")?;
    match serde_json::from_str(k).ok()? {
        Value::Object(m) => Some(Element::Keys(m)),
        _ => None,
    }
}

/// The index of the element a segment names.
pub fn find_index(items: &[Value], seg: &str) -> Option<usize> {
    match parse(seg)? {
        Element::Value(v) => items.iter().position(|i| *i == v),
        Element::Keys(keys) => items
            .iter()
            .position(|i| keys.iter().all(|(k, v)| i.get(k) == Some(v))),
    }
}

/// Render a segment as structured-merge-diff does: `.field`, `[="value"]`, `[name="x"]`.
pub fn display_segment(seg: &str) -> String {
    match parse(seg) {
        None => format!(".{seg}"),
        Some(Element::Value(v)) => format!("[={v}]"),
        Some(Element::Keys(keys)) => {
            let parts: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("[{}]", parts.join(","))
        }
    }
}

/// The `FieldsV1` key of a segment.
pub fn fields_v1_key(seg: &str) -> String {
    match seg.strip_prefix(ELEMENT) {
        Some(element) => element.to_owned(),
        None => format!("f:{seg}"),
    }
}

/// The segment of a `FieldsV1` key (`None` for `.` and unknown prefixes).
pub fn segment_of_fields_v1_key(key: &str) -> Option<String> {
    if let Some(f) = key.strip_prefix("f:") {
        Some(f.to_owned())
    } else if key.starts_with("v:") || key.starts_with("k:") {
        Some(format!("{ELEMENT}{key}"))
    } else {
        None
    }
}

/// Resolves the list kind at a path, for one resource type and version.
#[derive(Debug, Clone, Default)]
pub struct ListTypes {
    schema: Option<Value>,
    pod: bool,
}

fn keyed(keys: &[&str]) -> ListKind {
    ListKind::Map(keys.iter().map(|k| (*k).to_owned()).collect())
}

impl ListTypes {
    /// No schema, no pod rules (metadata rules only).
    pub const fn empty() -> Self {
        Self {
            schema: None,
            pod: false,
        }
    }

    /// From a CRD version's `openAPIV3Schema` (if any); `pod` enables the pod spec rules.
    pub fn new(schema: Option<Value>, pod: bool) -> Self {
        Self { schema, pod }
    }

    fn builtin(&self, names: &[&str]) -> Option<ListKind> {
        Some(match names {
            ["metadata", "finalizers"] => ListKind::Set,
            ["metadata", "ownerReferences"] => keyed(&["uid"]),
            _ if !self.pod => return None,
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers" | "volumes",
            ] => keyed(&["name"]),
            ["spec", "containers" | "initContainers", "*", "env"] => keyed(&["name"]),
            ["spec", "containers" | "initContainers", "*", "volumeMounts"] => keyed(&["mountPath"]),
            ["spec", "containers" | "initContainers", "*", "ports"] => keyed(&["containerPort"]),
            ["status", "conditions"] => keyed(&["type"]),
            _ => return None,
        })
    }

    fn declared_in_schema(&self, path: &[String]) -> Option<ListKind> {
        let mut cur = self.schema.as_ref()?;
        for seg in path {
            cur = if is_element(seg) {
                cur.get("items")?
            } else {
                cur.get("properties")
                    .and_then(|p| p.get(seg))
                    .or_else(|| cur.get("additionalProperties").filter(|a| a.is_object()))?
            };
        }
        match cur.get("x-kubernetes-list-type").and_then(Value::as_str)? {
            "set" => Some(ListKind::Set),
            "map" => Some(ListKind::Map(
                cur.get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|k| k.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
            )),
            _ => Some(ListKind::Atomic),
        }
    }

    /// The kind of the list at `path` (atomic unless declared otherwise).
    pub fn kind_at(&self, path: &[String]) -> ListKind {
        let names: Vec<&str> = path
            .iter()
            .map(|s| if is_element(s) { "*" } else { s.as_str() })
            .collect();
        self.builtin(&names)
            .or_else(|| self.declared_in_schema(path))
            .unwrap_or(ListKind::Atomic)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn segments_round_trip_through_fields_v1_and_find_their_element() {
        let items = vec![json!({"name": "a", "image": "x"}), json!({"name": "b"})];
        let seg = element_segment(&keyed(&["name"]), &items[1]).unwrap();
        assert_eq!(fields_v1_key(&seg), "k:{\"name\":\"b\"}");
        assert_eq!(segment_of_fields_v1_key(&fields_v1_key(&seg)).unwrap(), seg);
        assert_eq!(find_index(&items, &seg), Some(1));
        assert_eq!(display_segment(&seg), "[name=\"b\"]");
        let set = element_segment(&ListKind::Set, &json!("fin")).unwrap();
        assert_eq!(display_segment(&set), "[=\"fin\"]");
    }

    #[test]
    fn kinds_come_from_builtins_and_crd_schemas() {
        let schema = json!({"properties": {"status": {"properties": {"conditions": {
            "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}}}}});
        let lt = ListTypes::new(Some(schema), false);
        let p = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(lt.kind_at(&p("metadata.finalizers")), ListKind::Set);
        assert_eq!(lt.kind_at(&p("status.conditions")), keyed(&["type"]));
        assert_eq!(lt.kind_at(&p("spec.args")), ListKind::Atomic);
        assert_eq!(lt.kind_at(&p("spec.containers")), ListKind::Atomic);
        let pod = ListTypes::new(None, true);
        assert_eq!(pod.kind_at(&p("spec.containers")), keyed(&["name"]));
    }
}
