//! `.protobot/projection.yaml` (§6): parsing, class lookup, and adding a
//! `shared` entry while preserving every other key and entry.

use serde_yaml_ng::Value;

use crate::{diag::Diagnostic, node::Node, rules, vfs::PROJECTION_YAML, yaml};

/// Projection classes.
pub const CLASSES: [&str; 5] = [
    "shared",
    "test",
    "implementation",
    "integration-only",
    "attestation-only",
];

/// A parsed projection manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    /// `(path, class)` entries in file order.
    pub entries: Vec<(String, String)>,
    /// The full document, to preserve other keys on rewrite.
    pub doc: Value,
}

fn invalid(field: &str, message: &str) -> Diagnostic {
    let d = Diagnostic::new("projection.invalid", message)
        .at(PROJECTION_YAML)
        .hint("Fix .protobot/projection.yaml through a reviewed policy edit.");
    if field.is_empty() { d } else { d.field(field) }
}

/// Parses a manifest, or returns `projection.invalid` diagnostics.
pub fn parse(bytes: &[u8]) -> Result<Projection, Vec<Diagnostic>> {
    let doc = yaml::parse(bytes).map_err(|e| {
        vec![invalid(
            "",
            &format!("The projection manifest cannot be decoded: {e}."),
        )]
    })?;
    let Value::Mapping(map) = &doc else {
        return Err(vec![invalid(
            "",
            "The projection manifest is not a mapping.",
        )]);
    };
    let mut diags = Vec::new();
    match map.get("version") {
        Some(Value::Number(n)) if n.as_i64() == Some(1) => {}
        _ => diags.push(invalid(
            "version",
            "The projection manifest must declare version: 1.",
        )),
    }
    let mut entries = Vec::new();
    match map.get("paths") {
        None => {}
        Some(Value::Sequence(items)) => {
            let mut seen: Vec<String> = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let Value::Mapping(m) = item else {
                    diags.push(invalid(
                        &format!("paths[{i}]"),
                        "Each projection entry must be a mapping.",
                    ));
                    continue;
                };
                let keys_ok = m.len() == 2 && m.contains_key("path") && m.contains_key("class");
                if !keys_ok {
                    diags.push(invalid(
                        &format!("paths[{i}]"),
                        "Each projection entry needs exactly the keys path and class.",
                    ));
                    continue;
                }
                let path = m.get("path").and_then(Value::as_str).unwrap_or("");
                let class = m.get("class").and_then(Value::as_str).unwrap_or("");
                let bare = path.strip_suffix('/').unwrap_or(path);
                if !rules::is_canonical_path(bare) {
                    diags.push(invalid(
                        &format!("paths[{i}].path"),
                        "A projection path is not a canonical project-relative path.",
                    ));
                    continue;
                }
                if !CLASSES.contains(&class) {
                    diags.push(invalid(
                        &format!("paths[{i}].class"),
                        "A projection class is not one of the supported classes.",
                    ));
                    continue;
                }
                if seen.iter().any(|s| s == bare) {
                    diags.push(invalid(
                        &format!("paths[{i}].path"),
                        "A projection path is listed twice.",
                    ));
                    continue;
                }
                seen.push(bare.to_owned());
                entries.push((path.to_owned(), class.to_owned()));
            }
        }
        Some(_) => diags.push(invalid("paths", "The projection paths must be a sequence.")),
    }
    if diags.is_empty() {
        Ok(Projection { entries, doc })
    } else {
        Err(diags)
    }
}

impl Projection {
    /// Class of a file path `p` (own entry, then `p/`, then nearest ancestor).
    pub fn class_of(&self, p: &str) -> Option<&str> {
        let find = |key: &str| {
            self.entries
                .iter()
                .find(|(path, _)| path == key)
                .map(|(_, c)| c.as_str())
        };
        if let Some(c) = find(p).or_else(|| find(&format!("{p}/"))) {
            return Some(c);
        }
        let mut cur = p;
        while let Some((parent, _)) = cur.rsplit_once('/') {
            if let Some(c) = find(&format!("{parent}/")) {
                return Some(c);
            }
            cur = parent;
        }
        None
    }

    /// Adds a `shared` file entry for `p`, keeping other keys, and returns
    /// the new file text.
    pub fn with_shared(&self, p: &str) -> String {
        let mut entries = self.entries.clone();
        entries.push((p.to_owned(), "shared".to_owned()));
        entries.sort();
        let mut out = Node::map();
        let mut wrote_paths = false;
        if let Value::Mapping(map) = &self.doc {
            for (k, v) in map {
                let key = k.as_str().unwrap_or_default();
                if key == "paths" {
                    out = out.with("paths", entries_node(&entries));
                    wrote_paths = true;
                } else {
                    out = out.with(key, value_to_node(v));
                }
            }
        }
        if !wrote_paths {
            out = out.with("paths", entries_node(&entries));
        }
        yaml::emit(&out)
    }
}

fn entries_node(entries: &[(String, String)]) -> Node {
    Node::List(
        entries
            .iter()
            .map(|(p, c)| {
                Node::map()
                    .with("path", Node::s(p))
                    .with("class", Node::s(c))
            })
            .collect(),
    )
}

/// A fresh manifest with `shared` entries for the given paths (`project init`).
pub fn initial(paths: &[String]) -> String {
    let mut entries: Vec<(String, String)> = paths
        .iter()
        .map(|p| (p.clone(), "shared".to_owned()))
        .collect();
    entries.sort();
    yaml::emit(
        &Node::map()
            .with("version", Node::Int(1))
            .with("paths", entries_node(&entries)),
    )
}

fn value_to_node(v: &Value) -> Node {
    match v {
        Value::Bool(b) => Node::Bool(*b),
        Value::Number(n) => n.as_i64().map_or_else(|| Node::s(n.to_string()), Node::Int),
        Value::String(s) => Node::s(s),
        Value::Sequence(items) => Node::List(items.iter().map(value_to_node).collect()),
        Value::Mapping(m) => Node::Map(
            m.iter()
                .map(|(k, v)| (k.as_str().unwrap_or_default().to_owned(), value_to_node(v)))
                .collect(),
        ),
        Value::Null | Value::Tagged(_) => Node::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_prefers_the_most_specific_entry() {
        let p = parse(b"version: 1\npaths:\n  - path: docs/\n    class: test\n  - path: docs/vision.md\n    class: shared\n").unwrap();
        assert_eq!(p.class_of("docs/vision.md"), Some("shared"));
        assert_eq!(p.class_of("docs/a/b.md"), Some("test"));
        assert_eq!(p.class_of("src/x"), None);
        let text = p.with_shared("src/x");
        let q = parse(text.as_bytes()).unwrap();
        assert_eq!(q.class_of("src/x"), Some("shared"));
    }

    #[test]
    fn invalid_manifests() {
        for bad in [
            "paths: []\n",
            "version: '1'\n",
            "version: 2\n",
            "version: 1\npaths: {}\n",
            "version: 1\npaths:\n  - path: a\n",
            "version: 1\npaths:\n  - path: a\n    class: nope\n",
            "version: 1\npaths:\n  - path: a\n    class: shared\n  - path: a/\n    class: shared\n",
            "version: 1\npaths:\n  - path: /abs\n    class: shared\n",
        ] {
            let err = parse(bad.as_bytes()).unwrap_err();
            assert!(err.iter().all(|d| d.code == "projection.invalid"), "{bad}");
        }
    }
}
