//! Strict readers for untrusted JSON: timestamps without leap seconds and documents
//! without duplicate object keys.
//!
//! jiff reads `23:59:60` as `23:59:59`, and serde_json keeps the last of two equal keys:
//! both silently change what the caller wrote. The evaluator's inputs refuse both.

use std::fmt;

use jiff::Timestamp;
use serde::{
    Deserialize, Deserializer, Serializer,
    de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor},
};
use serde_json::{Map, Value};

/// Parses an RFC 3339 timestamp, refusing a `:60` seconds field (a leap second jiff would
/// silently read as `:59`).
pub fn parse_timestamp(text: &str) -> Result<Timestamp, String> {
    if has_leap_second(text) {
        return Err(format!(
            "`{}` has a `:60` seconds field; leap seconds are not accepted",
            text.escape_default()
        ));
    }
    text.parse::<Timestamp>().map_err(|e| e.to_string())
}

/// True when the time of an RFC 3339 text has `60` seconds (`…THH:MM:60…`).
fn has_leap_second(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes
        .iter()
        .position(|b| matches!(b, b'T' | b't' | b' '))
        .and_then(|t| bytes.get(t + 7..t + 9))
        .is_some_and(|seconds| seconds == b"60")
}

/// `#[serde(with = "crate::strict::timestamp")]` for `Timestamp` fields.
pub mod timestamp {
    use super::*;

    /// Serializes as jiff does.
    pub fn serialize<S: Serializer>(value: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(value, s)
    }

    /// Deserializes through [`parse_timestamp`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let text = String::deserialize(d)?;
        parse_timestamp(&text).map_err(de::Error::custom)
    }
}

/// `#[serde(with = "crate::strict::timestamp_option")]` for `Option<Timestamp>` fields.
pub mod timestamp_option {
    use super::*;

    /// Serializes as jiff does.
    pub fn serialize<S: Serializer>(value: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(value, s)
    }

    /// Deserializes through [`parse_timestamp`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) => parse_timestamp(&text).map(Some).map_err(de::Error::custom),
        }
    }
}

/// Parses a JSON document into a [`Value`], refusing an object that has the same key twice
/// (serde_json would keep the last one silently). Nesting is bounded by serde_json's
/// recursion limit (128).
pub fn parse_document(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = UniqueKeys.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

struct UniqueKeys;

impl<'de> DeserializeSeed<'de> for UniqueKeys {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number is not finite"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(UniqueKeys)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate key `{}`",
                    key.escape_default()
                )));
            }
            let value = map.next_value_seed(UniqueKeys)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leap_seconds_are_refused_and_ordinary_times_pass() {
        for text in [
            "2026-12-31T23:59:60Z",
            "2026-06-30t23:59:60+00:00",
            "2026-06-30 23:59:60.5Z",
        ] {
            assert!(parse_timestamp(text).is_err(), "{text}");
        }
        assert!(parse_timestamp("2026-12-31T23:59:59Z").is_ok());
        assert!(parse_timestamp("2026-12-31T23:60:00Z").is_err());
        assert!(parse_timestamp("\u{e9}\u{e9}T").is_err());
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        assert!(parse_document(r#"{"a": 1, "a": 2}"#).is_err());
        assert!(parse_document(r#"{"x": [{"b": 1, "b": 1}]}"#).is_err());
        assert!(parse_document(r#"{"a": 1} trailing"#).is_err());
        assert_eq!(
            parse_document(r#"{"a": [1, 2.5, "s", null, true, {"b": -3}]}"#).unwrap(),
            serde_json::json!({"a": [1, 2.5, "s", null, true, {"b": -3}]})
        );
    }
}
