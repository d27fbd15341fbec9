//! Shared helpers: the generated CRDs as JSON, schema navigation, fixtures and a small
//! structural validator that checks an instance the way the API server would (types,
//! required fields, enums, patterns, bounds, and unknown fields that would be pruned).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use protobot_api::crdgen;
use serde_json::Value;

/// The generated CRD of `kind` as JSON.
pub fn crd_json(kind: &str) -> Value {
    let crd = crdgen::all_crds()
        .into_iter()
        .find(|crd| crd.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for kind {kind}"));
    serde_json::to_value(crd).unwrap()
}

/// The `openAPIV3Schema` of the single version of `kind`.
pub fn root_schema(kind: &str) -> Value {
    let crd = crd_json(kind);
    let versions = crd["spec"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1, "{kind} has exactly one version");
    versions[0]["schema"]["openAPIV3Schema"].clone()
}

/// The schema at a dotted path below the root, e.g. `status.lease.fencingToken`.
/// Array steps are written as `[]`, e.g. `status.conditions.[].type`.
pub fn schema_at(kind: &str, path: &str) -> Value {
    let mut schema = root_schema(kind);
    for step in path.split('.') {
        schema = if step == "[]" {
            schema["items"].clone()
        } else {
            schema["properties"][step].clone()
        };
        assert!(
            !schema.is_null(),
            "{kind}: no schema at `{path}` (step `{step}`)"
        );
    }
    schema
}

/// Whether `field` is listed as required in `schema`.
pub fn is_required(schema: &Value, field: &str) -> bool {
    schema["required"]
        .as_array()
        .is_some_and(|r| r.iter().any(|f| f == field))
}

/// A fixed instant, so that tests never read the clock.
pub fn t(seconds_after_epoch_base: i64) -> Timestamp {
    // 2026-09-18T12:00:00Z, the evaluation time of the contract's golden fixture.
    Timestamp::from_second(1_789_732_800 + seconds_after_epoch_base).unwrap()
}

/// `t(..)` as a Kubernetes `Time`.
pub fn time(seconds: i64) -> Time {
    Time(t(seconds))
}

/// Validates `value` against a structural schema and returns every violation as
/// `path: problem`. It covers the parts of OpenAPI v3 the generated CRDs use.
pub fn validate(schema: &Value, value: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    validate_into(schema, value, path, &mut errors);
    errors
}

fn validate_into(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if schema["nullable"] != Value::Bool(true) {
            errors.push(format!("{path}: null is not allowed"));
        }
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        errors.push(format!("{path}: {value} is not one of {allowed:?}"));
    }
    match schema["type"].as_str() {
        Some("object") => validate_object(schema, value, path, errors),
        Some("array") => {
            let Some(items) = value.as_array() else {
                errors.push(format!("{path}: expected an array, got {value}"));
                return;
            };
            if let Some(max) = schema["maxItems"].as_u64()
                && items.len() as u64 > max
            {
                errors.push(format!(
                    "{path}: {} items exceed maxItems {max}",
                    items.len()
                ));
            }
            if let Some(min) = schema["minItems"].as_u64()
                && (items.len() as u64) < min
            {
                errors.push(format!(
                    "{path}: {} items are fewer than minItems {min}",
                    items.len()
                ));
            }
            for (i, item) in items.iter().enumerate() {
                validate_into(&schema["items"], item, &format!("{path}[{i}]"), errors);
            }
        }
        Some("string") => validate_string(schema, value, path, errors),
        Some("integer") => {
            let Some(n) = value
                .as_i64()
                .map(i128::from)
                .or(value.as_u64().map(i128::from))
            else {
                errors.push(format!("{path}: expected an integer, got {value}"));
                return;
            };
            if let Some(min) = schema["minimum"].as_f64()
                && (n as f64) < min
            {
                errors.push(format!("{path}: {n} is below minimum {min}"));
            }
            if let Some(max) = schema["maximum"].as_f64()
                && (n as f64) > max
            {
                errors.push(format!("{path}: {n} is above maximum {max}"));
            }
        }
        Some("boolean") => {
            if !value.is_boolean() {
                errors.push(format!("{path}: expected a boolean, got {value}"));
            }
        }
        other => errors.push(format!("{path}: schema has no supported type ({other:?})")),
    }
}

fn validate_object(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(fields) = value.as_object() else {
        errors.push(format!("{path}: expected an object, got {value}"));
        return;
    };
    for required in schema["required"].as_array().into_iter().flatten() {
        let required = required.as_str().unwrap();
        if !fields.contains_key(required) {
            errors.push(format!("{path}: required field `{required}` is missing"));
        }
    }
    for (name, field) in fields {
        let field_schema = &schema["properties"][name];
        if field_schema.is_null() {
            errors.push(format!(
                "{path}.{name}: unknown field (the API server would prune it)"
            ));
        } else {
            validate_into(field_schema, field, &format!("{path}.{name}"), errors);
        }
    }
}

fn validate_string(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(s) = value.as_str() else {
        errors.push(format!("{path}: expected a string, got {value}"));
        return;
    };
    let chars = s.chars().count() as u64;
    if let Some(min) = schema["minLength"].as_u64()
        && chars < min
    {
        errors.push(format!("{path}: length {chars} is below minLength {min}"));
    }
    if let Some(max) = schema["maxLength"].as_u64()
        && chars > max
    {
        errors.push(format!("{path}: length {chars} exceeds maxLength {max}"));
    }
    if let Some(pattern) = schema["pattern"].as_str()
        && !regex::Regex::new(pattern).unwrap().is_match(s)
    {
        errors.push(format!("{path}: {s:?} does not match {pattern}"));
    }
    if schema["format"] == "date-time" && s.parse::<Timestamp>().is_err() {
        errors.push(format!("{path}: {s:?} is not an RFC 3339 date-time"));
    }
}
