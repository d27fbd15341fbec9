//! The generated CRDs carry only the integer formats OpenAPI and kube-apiserver know
//! (`int32`, `int64`): schemars' `uint8`/`uint32`/`uint64` make the API server warn
//! ("unrecognized format") on every apply. The Rust types' bounds stay as `minimum` and
//! `maximum`.

use serde_json::Value;

use crate::util::{crd_json, schema_at};

/// `(path, format)` of every integer schema under `value`.
fn integer_formats(value: &Value, path: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            if map.get("type") == Some(&Value::from("integer")) {
                let format = map.get("format").and_then(Value::as_str).unwrap_or("");
                out.push((path.to_string(), format.to_string()));
            }
            for (k, v) in map {
                integer_formats(v, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                integer_formats(v, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn every_integer_format_is_one_the_api_server_knows() {
    let mut total = 0;
    for kind in [
        "Project",
        "ChangeSet",
        "BugReport",
        "BuildWorkItem",
        "InspectionRun",
    ] {
        let mut found = Vec::new();
        integer_formats(&crd_json(kind), kind, &mut found);
        total += found.len();
        let unknown: Vec<_> = found
            .iter()
            .filter(|(_, f)| !["", "int32", "int64"].contains(&f.as_str()))
            .collect();
        assert!(unknown.is_empty(), "{kind}: {unknown:?}");
    }
    assert!(total > 10, "no integer fields found: the walk is broken");
}

#[test]
fn unsigned_fields_keep_their_bounds() {
    // u32 → int64 bounded by u32::MAX, u8 → int32 bounded by the schema's own 100.
    let version = schema_at("InspectionRun", "spec.contractVersion");
    assert_eq!(version["format"], "int64");
    assert_eq!(version["minimum"], 1.0);
    let limit = schema_at("Project", "spec.wipLimit");
    assert_eq!(
        (limit["format"].as_str(), limit["minimum"].as_f64()),
        (Some("int64"), Some(1.0))
    );
    assert_eq!(limit["maximum"].as_f64(), Some(256.0));
    let score = schema_at("InspectionRun", "spec.mutation.minimumScorePercent");
    assert_eq!(score["format"], "int32");
    assert_eq!(score["maximum"].as_f64(), Some(100.0));
    assert_eq!(score["minimum"].as_f64(), Some(0.0));
}
