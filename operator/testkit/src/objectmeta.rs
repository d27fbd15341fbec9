//! Built-in object rules the real registry enforces on every write: label key
//! and value syntax, ConfigMap/Secret data keys, and Secret `stringData` being
//! folded into base64 `data`.

use serde_json::{Map, Value};

use crate::{error::Cause, resources::ResourceType};

fn invalid(field: String, value: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".to_owned(),
        message: format!("Invalid value: {value:?}: {detail}"),
        field,
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn qualified_name_part(s: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(ok_char)
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A label or annotation key: `[prefix/]name`.
fn qualified_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => dns_subdomain(prefix) && qualified_name_part(name),
        None => qualified_name_part(key),
    }
}

const KEY_DETAIL: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

fn check_labels(obj: &Value, causes: &mut Vec<Cause>) {
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if !qualified_key(k) {
                causes.push(invalid("metadata.labels".to_owned(), k, KEY_DETAIL));
            }
            let v = v.as_str().unwrap_or("");
            if !(v.is_empty() || qualified_name_part(v)) {
                let detail = if v.len() > 63 {
                    "must be no more than 63 characters"
                } else {
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
                };
                causes.push(invalid("metadata.labels".to_owned(), v, detail));
            }
        }
    }
    if let Some(annotations) = obj
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        for k in annotations.keys().filter(|k| !qualified_key(k)) {
            causes.push(invalid("metadata.annotations".to_owned(), k, KEY_DETAIL));
        }
    }
}

fn check_data_keys(obj: &Value, fields: &[&str], causes: &mut Vec<Cause>) {
    for field in fields {
        let Some(map) = obj.get(*field).and_then(Value::as_object) else {
            continue;
        };
        for k in map.keys() {
            let ok = !k.is_empty()
                && k.len() <= 253
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                causes.push(invalid(
                    format!("{field}[{k}]"),
                    k,
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                ));
            }
        }
    }
}

/// Standard base64 with padding.
pub fn encode_base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Fold Secret `stringData` into `data` (base64), as the API server does on write.
fn fold_string_data(obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let Some(Value::Object(string_data)) = map.remove("stringData") else {
        return;
    };
    let data = map
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    if !data.is_object() {
        *data = Value::Object(Map::new());
    }
    if let Some(data) = data.as_object_mut() {
        for (k, v) in string_data {
            data.insert(
                k,
                Value::String(encode_base64(v.as_str().unwrap_or("").as_bytes())),
            );
        }
    }
}

/// Normalize and check an object of a built-in or custom type.
pub fn check(rt: &ResourceType, obj: &mut Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let core = rt.group.is_empty();
    if core && rt.plural == "secrets" {
        fold_string_data(obj);
        check_data_keys(obj, &["data"], &mut causes);
    }
    if core && rt.plural == "configmaps" {
        check_data_keys(obj, &["data", "binaryData"], &mut causes);
    }
    if core && rt.plural == "pods" {
        causes.extend(crate::podcheck::check(obj));
    }
    check_labels(obj, &mut causes);
    causes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn base64_encodes_like_the_standard_alphabet() {
        assert_eq!(encode_base64(b"hello"), "aGVsbG8=");
        assert_eq!(encode_base64(b"hi"), "aGk=");
        assert_eq!(encode_base64(b"abc"), "YWJj");
        assert_eq!(encode_base64(b""), "");
    }

    #[test]
    fn label_rules_match_the_api_server() {
        assert!(qualified_key("app.kubernetes.io/name"));
        assert!(qualified_key("app"));
        assert!(!qualified_key("-app"));
        assert!(!qualified_key("Bad_Prefix/x"));
        assert!(qualified_name_part(&"a".repeat(63)));
        assert!(!qualified_name_part(&"a".repeat(64)));
    }

    #[test]
    fn secret_string_data_folds_into_data() {
        let mut s = json!({"data": {"a": "eA=="}, "stringData": {"b": "hello"}});
        fold_string_data(&mut s);
        assert_eq!(s, json!({"data": {"a": "eA==", "b": "aGVsbG8="}}));
    }
}
