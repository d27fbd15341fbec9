//! An ordered document tree shared by the canonical YAML writer and the JSON
//! envelopes: key order is struct order, never alphabetical (§4, §15).

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// An ordered JSON/YAML value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// `null` (JSON only; never written to YAML records).
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string.
    Str(String),
    /// A sequence.
    List(Vec<Node>),
    /// A mapping in insertion order.
    Map(Vec<(String, Node)>),
}

impl Node {
    /// A string node.
    pub fn s(v: impl Into<String>) -> Node {
        Node::Str(v.into())
    }

    /// A list of string nodes.
    pub fn strs<I, S>(items: I) -> Node
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Node::List(items.into_iter().map(|s| Node::Str(s.into())).collect())
    }

    /// An empty mapping, to be filled with [`Node::with`].
    pub fn map() -> Node {
        Node::Map(Vec::new())
    }

    /// Appends a key to a mapping (no-op on other nodes).
    pub fn with(mut self, key: &str, value: Node) -> Node {
        if let Node::Map(entries) = &mut self {
            entries.push((key.to_owned(), value));
        }
        self
    }

    /// Appends a string key only when the value is non-empty.
    pub fn with_opt_str(self, key: &str, value: &str) -> Node {
        if value.is_empty() {
            self
        } else {
            self.with(key, Node::s(value))
        }
    }

    /// Looks a key up in a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Null => ser.serialize_unit(),
            Node::Bool(b) => ser.serialize_bool(*b),
            Node::Int(i) => ser.serialize_i64(*i),
            Node::Str(s) => ser.serialize_str(s),
            Node::List(items) => {
                let mut seq = ser.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Map(entries) => {
                let mut map = ser.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}
