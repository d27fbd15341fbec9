//! Stable fingerprints: SHA-256 over a canonical JSON encoding (object keys
//! sorted bytewise at every level, no insignificant whitespace, serde_json's
//! number and string escaping). Only equality of fingerprints matters (§8).

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Writes `value` canonically into `out`.
pub fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(k) {
                    canonical_json(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `sha256:<hex>` of the canonical encoding of `value`.
pub fn digest_value(value: &Value) -> String {
    let mut s = String::new();
    canonical_json(value, &mut s);
    format!("sha256:{}", hex::encode(Sha256::digest(s.as_bytes())))
}

/// `sha256:<hex>` of any serializable value (serialization failures hash as null,
/// which cannot happen for the plain data types used here).
pub fn digest<T: Serialize>(value: &T) -> String {
    digest_value(&serde_json::to_value(value).unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn key_order_does_not_change_the_digest() {
        let a = json!({"b": 1, "a": {"y": [1, 2], "x": "s"}});
        let b = json!({"a": {"x": "s", "y": [1, 2]}, "b": 1});
        assert_eq!(digest_value(&a), digest_value(&b));
    }

    #[test]
    fn array_order_and_values_change_the_digest() {
        assert_ne!(digest_value(&json!([1, 2])), digest_value(&json!([2, 1])));
        assert_ne!(
            digest_value(&json!({"a": 1})),
            digest_value(&json!({"a": 2}))
        );
    }

    #[test]
    fn canonical_encoding_is_compact_and_sorted() {
        let mut s = String::new();
        canonical_json(&json!({"z": null, "a": "q\""}), &mut s);
        assert_eq!(s, r#"{"a":"q\"","z":null}"#);
    }
}
