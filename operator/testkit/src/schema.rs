//! Structural-schema handling of custom resources against a CRD's `openAPIV3Schema`:
//! prune unknown fields (unless `x-kubernetes-preserve-unknown-fields`), drop
//! non-nullable nulls, apply `default`s, then validate types, `required`, `enum`,
//! bounds and lengths. Field errors carry the same reasons the real server uses.

use serde_json::{Map, Value};

use crate::error::Cause;

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn render(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) => "\"object\"".to_owned(),
        Value::Array(_) => "\"array\"".to_owned(),
        other => other.to_string(),
    }
}

fn invalid(path: &str, value: &Value, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".to_owned(),
        message: format!("Invalid value: {}: {detail}", render(value)),
        field: path.to_owned(),
    }
}

/// Prune, default and validate `value` in place; returns every field error found.
/// At the root, `apiVersion`, `kind` and `metadata` are kept as they are.
#[cfg(test)]
pub fn validate(value: &mut Value, schema: &Value) -> Vec<Cause> {
    validate_reporting_unknown(value, schema).0
}

/// Marks a pruned field among the walk's findings (never returned as an error).
const UNKNOWN: &str = "testkit/UnknownField";

/// Like [`validate`], also returning the paths of the unknown fields that were
/// pruned (for `fieldValidation=Strict`).
pub fn validate_reporting_unknown(value: &mut Value, schema: &Value) -> (Vec<Cause>, Vec<String>) {
    let mut found = Vec::new();
    walk(value, schema, "", &mut found, true);
    let (unknown, errs): (Vec<Cause>, Vec<Cause>) =
        found.into_iter().partition(|c| c.reason == UNKNOWN);
    (errs, unknown.into_iter().map(|c| c.field).collect())
}

fn walk(value: &mut Value, schema: &Value, path: &str, errs: &mut Vec<Cause>, root: bool) {
    let int_or_string = flag(schema, "x-kubernetes-int-or-string");
    let ty = schema.get("type").and_then(Value::as_str);
    if int_or_string {
        if !matches!(type_name(value), "integer" | "string") {
            errs.push(invalid(
                path,
                value,
                &format!("{path} in body must be of type integer,string"),
            ));
        }
    } else if let Some(ty) = ty {
        let actual = type_name(value);
        let ok = actual == ty || (ty == "number" && actual == "integer");
        if !ok {
            errs.push(invalid(
                path,
                value,
                &format!("{path} in body must be of type {ty}: \"{actual}\""),
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let supported: Vec<String> = allowed.iter().map(render).collect();
        errs.push(Cause {
            reason: "FieldValueNotSupported".to_owned(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                render(value),
                supported.join(", ")
            ),
            field: path.to_owned(),
        });
    }
    match value {
        Value::Object(map) => walk_object(map, schema, path, errs, root),
        Value::Array(items) => {
            check_len(
                items.len(),
                schema,
                "Items",
                "items",
                path,
                &Value::Array(Vec::new()),
                errs,
            );
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item, item_schema, &format!("{path}[{i}]"), errs, false);
                }
            }
        }
        Value::String(s) => {
            let len = s.chars().count();
            let v = Value::String(s.clone());
            check_len(len, schema, "Length", "characters", path, &v, errs);
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            let v = Value::Number(n.clone());
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                && x < min
            {
                errs.push(invalid(
                    path,
                    &v,
                    &format!("{path} in body should be greater than or equal to {min}"),
                ));
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                && x > max
            {
                errs.push(invalid(
                    path,
                    &v,
                    &format!("{path} in body should be less than or equal to {max}"),
                ));
            }
        }
        _ => {}
    }
}

fn check_len(
    len: usize,
    schema: &Value,
    what: &str,
    unit: &str,
    path: &str,
    value: &Value,
    errs: &mut Vec<Cause>,
) {
    let min = schema.get(format!("min{what}")).and_then(Value::as_u64);
    let max = schema.get(format!("max{what}")).and_then(Value::as_u64);
    let len = len as u64;
    if let Some(min) = min
        && len < min
    {
        errs.push(invalid(
            path,
            value,
            &format!("{path} in body should have at least {min} {unit}"),
        ));
    }
    if let Some(max) = max
        && len > max
    {
        errs.push(Cause {
            reason: "FieldValueTooMany".to_owned(),
            message: format!("Too many: {len}: must have at most {max} {unit}"),
            field: path.to_owned(),
        });
    }
}

fn walk_object(
    map: &mut Map<String, Value>,
    schema: &Value,
    path: &str,
    errs: &mut Vec<Cause>,
    root: bool,
) {
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        if root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let child_schema = props
            .and_then(|p| p.get(&key))
            .or_else(|| additional.filter(|a| a.is_object()));
        match child_schema {
            Some(child) => {
                if map.get(&key).is_some_and(Value::is_null) && !flag(child, "nullable") {
                    map.remove(&key);
                    continue;
                }
                if let Some(v) = map.get_mut(&key) {
                    walk(v, child, &join(path, &key), errs, false);
                }
            }
            None if preserve || additional == Some(&Value::Bool(true)) => {}
            None => {
                map.remove(&key);
                errs.push(Cause {
                    reason: UNKNOWN.to_owned(),
                    message: "unknown field".to_owned(),
                    field: join(path, &key),
                });
            }
        }
    }
    if let Some(props) = props {
        for (key, child) in props {
            if !map.contains_key(key)
                && let Some(default) = child.get("default")
            {
                let mut d = default.clone();
                walk(&mut d, child, &join(path, key), errs, false);
                map.insert(key.clone(), d);
            }
        }
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for key in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(key) {
                let field = join(path, key);
                errs.push(Cause {
                    reason: "FieldValueRequired".to_owned(),
                    message: "Required value".to_owned(),
                    field,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string", "minLength": 1},
                        "replicas": {"type": "integer", "minimum": 0, "default": 1},
                        "mode": {"type": "string", "enum": ["fast", "slow"]},
                        "port": {"x-kubernetes-int-or-string": true},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                        "env": {"type": "object", "additionalProperties": {"type": "string"}}
                    }
                },
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }
        })
    }

    #[test]
    fn valid_object_is_pruned_and_defaulted() {
        let mut v = json!({
            "apiVersion": "x/v1", "kind": "W", "metadata": {"name": "a"},
            "spec": {"image": "i", "unknown": 1, "extra": {"kept": true}, "port": "http", "env": {"A": "b"}},
            "junk": 1
        });
        assert!(validate(&mut v, &schema()).is_empty());
        assert_eq!(v["spec"]["replicas"], 1);
        assert!(v["spec"].get("unknown").is_none());
        assert!(v.get("junk").is_none());
        assert_eq!(v["spec"]["extra"]["kept"], true);
    }

    #[test]
    fn type_required_enum_and_bounds_errors_name_the_field() {
        let mut v = json!({"spec": {"replicas": "two", "mode": "medium", "tags": ["a","b","c"], "env": {"A": 1}}});
        let errs = validate(&mut v, &schema());
        let fields: Vec<&str> = errs.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"spec.replicas"), "{errs:?}");
        assert!(fields.contains(&"spec.mode"), "{errs:?}");
        assert!(fields.contains(&"spec.image"), "{errs:?}");
        assert!(fields.contains(&"spec.tags"), "{errs:?}");
        assert!(fields.contains(&"spec.env.A"), "{errs:?}");
        let replicas = errs.iter().find(|c| c.field == "spec.replicas").unwrap();
        assert_eq!(
            replicas.message,
            "Invalid value: \"two\": spec.replicas in body must be of type integer: \"string\""
        );
    }
}
