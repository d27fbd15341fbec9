//! A fast parse path for the canonical record layout (issue 3 benchmark).
//!
//! Record files written by ears-manager (and by the Go `yaml.v3` writer) use
//! a small, regular subset of YAML: full-line comments at column 0, block
//! mappings with simple keys, block sequences (also the indentless form under
//! a key), plain scalars, single-line quoted scalars, `[]` and `{}`. This
//! module parses exactly that subset, line by line, into a borrowed tree
//! that converts to the same [`Value`] the full parser would build
//! ([`parse`]), or that record types deserialize from directly ([`decode`],
//! skipping the hashed `Value` mapping and the second pass of
//! `from_value`).
//!
//! It is only a shortcut: whenever the input strays from the subset, or
//! anything could be read two ways, it returns `None` and the caller falls
//! back to the full parser, which then produces the result (or the error)
//! exactly as before. A typed decode that fails here also falls back, so
//! error messages always come from the full path. A `Some` is therefore only
//! ever returned for inputs on which the full parser agrees (tested against
//! it on generated and mutated documents).

use std::borrow::Cow;

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_yaml_ng::{Mapping, Number, Value};

/// A parsed node of the canonical subset (no nulls: the full parser
/// reports those).
#[derive(Debug, Clone, PartialEq)]
enum Node<'a> {
    Str(Cow<'a, str>),
    Bool(bool),
    Int(u64),
    Seq(Vec<Node<'a>>),
    Map(Vec<(&'a str, Node<'a>)>),
}

impl Node<'_> {
    fn into_value(self) -> Value {
        match self {
            Node::Str(s) => Value::String(s.into_owned()),
            Node::Bool(b) => Value::Bool(b),
            Node::Int(n) => Value::Number(Number::from(n)),
            Node::Seq(items) => Value::Sequence(items.into_iter().map(Node::into_value).collect()),
            Node::Map(entries) => {
                let mut map = Mapping::with_capacity(entries.len());
                for (k, v) in entries {
                    map.insert(Value::String(k.to_owned()), v.into_value());
                }
                Value::Mapping(map)
            }
        }
    }
}

/// One content line: its indentation and the text after it.
#[derive(Clone, Copy)]
struct Line<'a> {
    indent: usize,
    text: &'a str,
}

/// Parses `text` into a [`Value`] when it is in the canonical subset.
pub(super) fn parse(text: &str) -> Option<Value> {
    tree(text).map(Node::into_value)
}

/// Decodes a record from a canonical mapping document; `None` when the
/// text is outside the subset or the typed decode fails (the full path then
/// reports why).
pub(super) fn decode<T: DeserializeOwned>(text: &str) -> Option<T> {
    match tree(text)? {
        map @ Node::Map(_) => T::deserialize(map).ok(),
        _ => None,
    }
}

fn tree(text: &str) -> Option<Node<'_>> {
    // One pass over the bytes: split lines, measure indentation, and accept
    // printable characters and LF only (no tabs, CR, control characters,
    // NEL/LS/PS or BOMs, which all have reader-level rules of their own).
    // Non-ASCII characters can only end up in quoted scalars: keys and plain
    // scalars are ASCII.
    let b = text.as_bytes();
    let mut lines = Vec::with_capacity(b.len() / 20 + 1);
    let mut i = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        let body = i;
        while i < b.len() && b[i] != b'\n' {
            if (b' '..=b'~').contains(&b[i]) {
                i += 1;
            } else {
                // Non-ASCII: only characters the YAML reader accepts as
                // printable and that are not line breaks or a BOM to it.
                let c = text.get(i..)?.chars().next()?;
                if !printable_non_ascii(c) {
                    return None;
                }
                i += c.len_utf8();
            }
        }
        let end = i;
        i += 1;
        match b.get(body) {
            // A full-line comment at column 0.
            Some(b'#') if body == start => continue,
            // Blank, indented-comment or trailing-space lines.
            _ if body == end || b[body] == b'#' || b[end - 1] == b' ' => return None,
            _ => {}
        }
        lines.push(Line {
            indent: body - start,
            text: text.get(body..end)?,
        });
    }
    let first = lines.first()?;
    if first.indent != 0 {
        return None;
    }
    let mut p = Parser { lines, at: 0 };
    let value = p.node(0)?;
    (p.at == p.lines.len()).then_some(value)
}

/// libyaml's printable set above ASCII, minus what it treats as a line
/// break (NEL, LS, PS) or a byte-order mark.
fn printable_non_ascii(c: char) -> bool {
    matches!(u32::from(c), 0xA0..=0xD7FF | 0xE000..=0xFFFD | 0x1_0000..)
        && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}')
}

struct Parser<'a> {
    lines: Vec<Line<'a>>,
    at: usize,
}

/// Whether a line is a block sequence entry.
fn is_entry(text: &str) -> bool {
    text.starts_with("- ") || text == "-"
}

/// Splits `key:` / `key: rest` into the key and the value text (`""` when
/// the value is on the following lines). Only simple keys qualify.
fn split_key(text: &str) -> Option<(&str, &str)> {
    let b = text.as_bytes();
    let first = *b.first()?;
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return None;
    }
    let end = b
        .iter()
        .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-'))?;
    if b[end] != b':' {
        return None;
    }
    match &text[end + 1..] {
        "" => Some((&text[..end], "")),
        rest => rest.strip_prefix(' ').map(|v| (&text[..end], v)),
    }
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<Line<'a>> {
        self.lines.get(self.at).copied()
    }

    /// A block node whose first line is the current one, at `indent`.
    fn node(&mut self, indent: usize) -> Option<Node<'a>> {
        let line = self.peek()?;
        if line.indent != indent {
            return None;
        }
        if is_entry(line.text) {
            self.sequence(indent)
        } else {
            self.mapping(indent)
        }
    }

    fn mapping(&mut self, indent: usize) -> Option<Node<'a>> {
        let mut map: Vec<(&'a str, Node<'a>)> = Vec::with_capacity(8);
        while let Some(line) = self.peek() {
            if line.indent < indent {
                break;
            }
            if line.indent > indent || is_entry(line.text) {
                return None;
            }
            let (key, rest) = split_key(line.text)?;
            // Keys resolve like values: `true:` is a boolean key, and
            // `null:` a null one. (A simple key is otherwise always a plain
            // string: it starts with a letter or `_`.)
            if is_null(key) || matches!(key, "true" | "True" | "TRUE" | "false" | "False" | "FALSE")
            {
                return None;
            }
            self.at += 1;
            let value = if rest.is_empty() {
                match self.peek() {
                    Some(next) if next.indent > indent => self.node(next.indent)?,
                    // The indentless sequence: `key:` then `- item` lines at
                    // the key's own indentation.
                    Some(next) if next.indent == indent && is_entry(next.text) => {
                        self.sequence(indent)?
                    }
                    // An empty value is a null: leave that to the full parser.
                    _ => return None,
                }
            } else {
                scalar(rest)?
            };
            if map.iter().any(|(k, _)| *k == key) {
                return None;
            }
            map.push((key, value));
        }
        Some(Node::Map(map))
    }

    fn sequence(&mut self, indent: usize) -> Option<Node<'a>> {
        let mut items = Vec::new();
        while let Some(line) = self.peek() {
            if line.indent < indent {
                break;
            }
            if line.indent > indent {
                return None;
            }
            if !is_entry(line.text) {
                // A mapping key after an indentless sequence ends it; in any
                // other position the full parser decides.
                break;
            }
            let item = line.text.strip_prefix("- ")?;
            if item.starts_with(' ') || is_entry(item) {
                return None;
            }
            if split_key(item).is_some() {
                // `- key: …` opens a mapping whose keys sit two columns in.
                self.lines[self.at] = Line {
                    indent: indent + 2,
                    text: item,
                };
                items.push(self.mapping(indent + 2)?);
            } else {
                self.at += 1;
                items.push(scalar(item)?);
                if self.peek().is_some_and(|n| n.indent > indent) {
                    return None;
                }
            }
        }
        Some(Node::Seq(items))
    }
}

/// A complete single-line scalar (the whole rest of the line).
fn scalar(text: &str) -> Option<Node<'_>> {
    match text.as_bytes().first()? {
        b'"' => double_quoted(text).map(Node::Str),
        b'\'' => single_quoted(text).map(Node::Str),
        b'[' => (text == "[]").then(|| Node::Seq(Vec::new())),
        b'{' => (text == "{}").then(|| Node::Map(Vec::new())),
        b'0'..=b'9' => integer(text),
        _ if is_null(text) => None,
        _ => plain(text),
    }
}

/// The plain scalars that read as null (left to the full parser).
fn is_null(text: &str) -> bool {
    matches!(text, "null" | "Null" | "NULL" | "~")
}

/// Decimal integers without sign or leading zeros that fit a `u64`.
fn integer(text: &str) -> Option<Node<'_>> {
    if text.len() > 18 || !text.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if text.len() > 1 && text.starts_with('0') {
        return None;
    }
    text.parse::<u64>().ok().map(Node::Int)
}

/// Plain scalars that can only be read as a string or a boolean (callers
/// refuse the null spellings first).
fn plain(text: &str) -> Option<Node<'_>> {
    let b = text.as_bytes();
    let first = *b.first()?;
    if !(first.is_ascii_alphabetic() || first == b'_' || first == b'/') {
        return None;
    }
    // One pass: only the emitter's plain-safe characters (no `#`), and no
    // `: ` inside or `:` at the end (which would start a mapping value).
    let mut prev = 0u8;
    for &c in b {
        if !PLAIN_SAFE[usize::from(c)] || (prev == b':' && c == b' ') {
            return None;
        }
        prev = c;
    }
    if prev == b':' {
        return None;
    }
    Some(match text {
        "true" | "True" | "TRUE" => Node::Bool(true),
        "false" | "False" | "FALSE" => Node::Bool(false),
        _ => Node::Str(Cow::Borrowed(text)),
    })
}

/// ASCII letters, digits and ` _-./,()'?;=+%:` (the writer's plain set).
static PLAIN_SAFE: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric();
        c += 1;
    }
    let extra = b" _-./,()'?;=+%:";
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = true;
        i += 1;
    }
    t
};

/// `"…"` closed on the same line, with nothing after the closing quote.
/// Escapes: the JSON set; anything rarer goes to the full parser.
fn double_quoted(text: &str) -> Option<Cow<'_, str>> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains(['"', '\\']) {
        return Some(Cow::Borrowed(inner));
    }
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => out.push(match chars.next()? {
                '"' => '"',
                '\\' => '\\',
                '/' => '/',
                'b' => '\u{8}',
                'f' => '\u{c}',
                'n' => '\n',
                'r' => '\r',
                't' => '\t',
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    if hex.len() != 4 || !hex.bytes().all(|h| h.is_ascii_hexdigit()) {
                        return None;
                    }
                    char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
                }
                _ => return None,
            }),
            c => out.push(c),
        }
    }
    Some(Cow::Owned(out))
}

/// `'…'` closed on the same line, nothing after it. An escaped quote (`''`)
/// is left to the full path: the lexical anchor scan reads such lines
/// differently, and only the full path reproduces that.
fn single_quoted(text: &str) -> Option<Cow<'_, str>> {
    let inner = text.strip_prefix('\'')?.strip_suffix('\'')?;
    (!inner.contains('\'')).then_some(Cow::Borrowed(inner))
}

/// Why the fast typed decode gave up (never shown: the full path reruns).
#[derive(Debug)]
struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("declined")
    }
}

impl std::error::Error for Declined {}

impl de::Error for Declined {
    fn custom<T: std::fmt::Display>(_msg: T) -> Self {
        Declined
    }
}

/// Mirrors `serde_yaml_ng::Value`'s deserializer on the success paths:
/// typed requests accept only the matching node kind, sequences and maps
/// must be consumed completely, and there are no nulls (so every option is
/// `Some`). Any mismatch is an error, which sends the caller to the full
/// path.
impl<'de, 'a> de::Deserializer<'de> for Node<'a> {
    type Error = Declined;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        match self {
            Node::Str(s) => visitor.visit_string(s.into_owned()),
            Node::Bool(b) => visitor.visit_bool(b),
            Node::Int(n) => visitor.visit_u64(n),
            Node::Seq(items) => visit_seq(items, visitor),
            Node::Map(entries) => visit_map(entries, visitor),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        match self {
            Node::Bool(b) => visitor.visit_bool(b),
            _ => Err(Declined),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        match self {
            Node::Str(s) => visitor.visit_string(s.into_owned()),
            _ => Err(Declined),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.deserialize_string(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.deserialize_string(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        visitor.visit_some(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        match self {
            Node::Seq(items) => visit_seq(items, visitor),
            _ => Err(Declined),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        match self {
            Node::Map(entries) => visit_map(entries, visitor),
            _ => Err(Declined),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Declined> {
        self.deserialize_map(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Declined> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        visitor.visit_unit()
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Declined> {
        Err(Declined)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Declined> {
        Err(Declined)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _visitor: V,
    ) -> Result<V::Value, Declined> {
        Err(Declined)
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.number(visitor)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.number(visitor)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.number(visitor)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.number(visitor)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.number(visitor)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.number(visitor)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.number(visitor)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        self.number(visitor)
    }

    // Everything else (floats, chars, bytes, tuples) is not part of any
    // record schema: leave it to the full path.
    fn deserialize_f32<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Declined> {
        Err(Declined)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Declined> {
        Err(Declined)
    }
    fn deserialize_char<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Declined> {
        Err(Declined)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Declined> {
        Err(Declined)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Declined> {
        Err(Declined)
    }
    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value, Declined> {
        Err(Declined)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value, Declined> {
        Err(Declined)
    }
}

impl Node<'_> {
    fn number<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Declined> {
        match self {
            Node::Int(n) => visitor.visit_u64(n),
            _ => Err(Declined),
        }
    }
}

fn visit_seq<'de, V: Visitor<'de>>(items: Vec<Node<'_>>, visitor: V) -> Result<V::Value, Declined> {
    let mut access = Items(items.into_iter());
    let out = visitor.visit_seq(&mut access)?;
    if access.0.len() == 0 {
        Ok(out)
    } else {
        Err(Declined)
    }
}

fn visit_map<'de, V: Visitor<'de>>(
    entries: Vec<(&str, Node<'_>)>,
    visitor: V,
) -> Result<V::Value, Declined> {
    let mut access = Entries {
        iter: entries.into_iter(),
        value: None,
    };
    let out = visitor.visit_map(&mut access)?;
    if access.iter.len() == 0 {
        Ok(out)
    } else {
        Err(Declined)
    }
}

struct Items<'a>(std::vec::IntoIter<Node<'a>>);

impl<'de> SeqAccess<'de> for Items<'_> {
    type Error = Declined;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Declined> {
        self.0.next().map(|n| seed.deserialize(n)).transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Entries<'a> {
    iter: std::vec::IntoIter<(&'a str, Node<'a>)>,
    value: Option<Node<'a>>,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = Declined;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Declined> {
        match self.iter.next() {
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(Node::Str(Cow::Borrowed(k))).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Declined> {
        match self.value.take() {
            Some(v) => seed.deserialize(v),
            None => Err(Declined),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(text: &str) -> Option<Value> {
        serde_yaml_ng::from_str::<Value>(text).ok()
    }

    /// The fast path either declines, or agrees with the full parser and
    /// the document passes the lexical anchor scan (which the typed fast
    /// decode therefore skips).
    fn agrees(text: &str) -> bool {
        match parse(text) {
            None => true,
            Some(v) => full(text).as_ref() == Some(&v) && super::super::check_anchors(text).is_ok(),
        }
    }

    const CANONICAL: &[&str] = &[
        "# managed by ears-manager; do not edit by hand\nid: REQ-CLI-00001\ntype: event-driven\ntext: When x arrives, the CLI shall answer.\napplies_to:\n  interfaces:\n    - cli\n  scopes:\n    - scope-1\nverification:\n  mode: isolated-interface\nprovenance: user-authored\ncreated: \"2026-09-15T12:00:00Z\"\nrelationships:\n  - type: depends-on\n    target: REQ-CLI-00002\n  - type: related-to\n    target: REQ-CLI-00003\nstatus: active\n",
        "id: CS-00001\noperations: []\naffected_interfaces: []\nimplementation_required: true\nimpact_assessment:\n  - requirement_id: REQ-A-00001\n    disposition: applicable\n    rationale: \"Tab\\there, quote \\\" and \\u00e9 \\u0085\"\n    origin: candidate\nmeta: {}\n",
        "schema_versions:\n    specification: 1\n    project: 1\nrepository:\n    canonical_remote: https://h/x\n    default_branch: main\napplies_to:\n    interfaces:\n        - cli\n        - web\nlist:\n- a\n- 'its'\nafter: x\n",
        "- a\n- b: c\n  d: e\n- f\n",
        "k: True\nn: 0\nm: 12345\nq: FALSE\nz: /root/x\nw: a:b\n",
        "# é — comment\ntext: \"Caf\u{e9} \u{2265} 5 \u{1F600} \u{a0}x\"\nq: 'na\u{ef}ve \u{2014} ok'\n",
    ];

    #[test]
    fn canonical_documents_parse_exactly_as_the_full_parser_does() {
        for doc in CANONICAL {
            let fast = parse(doc);
            assert!(fast.is_some(), "declined {doc:?}");
            assert_eq!(fast, full(doc), "{doc:?}");
        }
    }

    #[test]
    fn declines_what_it_does_not_cover() {
        for doc in [
            "a: b\n\nc: d\n",
            "a: b # comment\n",
            "a:\n",
            "a:\nb: c\n",
            "  a: b\n",
            "a: b\na: c\n",
            "a: \"x\n  y\"\n",
            "a: |\n  x\n",
            "a: &x b\n",
            "a: 007\n",
            "a: -1\n",
            "a: ~\n",
            "a: \"\\x41\"\n",
            "a: \"\\ud800\"\n",
            "a:\tb\n",
            "a: é\n",
            "a: b\r\n",
            "a: [b]\n",
            "\"a\": b\n",
            "a:  b\n",
            "a: b\n  c: d\n",
            "a:\n  - b\n    c\n",
            "- - a\n",
            "a: yes: no\n",
            "---\na: b\n",
            "a: b \n",
            "a: 1.5\n",
            "true: x\n",
            "null: x\n",
            "- 'it''s: *x'\n",
            "a: 'it''s'\n",
            "a: b#c\n",
            "a: caf\u{e9}\n",
            "a: \"x\u{85}y\"\n",
            "a: \"x\u{2028}y\"\n",
            "a: \"\u{feff}y\"\n",
            "a: \"x\u{fffe}\"\n",
            "\u{e9}: x\n",
        ] {
            assert!(parse(doc).is_none(), "accepted {doc:?}");
        }
    }

    /// Non-ASCII characters for the mutations: accepted ones, YAML line
    /// breaks, a BOM, a non-character and a C1 control.
    const WIDE: &[&str] = &[
        "\u{e9}",
        "\u{2014}",
        "\u{2265}",
        "\u{1F600}",
        "\u{a0}",
        "\u{e000}",
        "\u{85}",
        "\u{2028}",
        "\u{2029}",
        "\u{feff}",
        "\u{fffe}",
        "\u{9f}",
    ];

    /// xorshift64*, as in the crate's property tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn mutated_documents_never_disagree_with_the_full_parser() {
        let alphabet: &[u8] = b" \n-:#'\"\\[]{}&*!|>?,.%@`0123456789aeZnulltrue_/\t";
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut accepted, mut accepted_wide) = (0usize, 0usize);
        for round in 0..15_000 {
            let mut doc = CANONICAL[round % CANONICAL.len()].as_bytes().to_vec();
            for _ in 0..=rng.below(3) {
                let at = rng.below(doc.len() + 1);
                match rng.below(4) {
                    0 if at < doc.len() => {
                        doc.remove(at);
                    }
                    1 if at < doc.len() => doc[at] = alphabet[rng.below(alphabet.len())],
                    2 => {
                        let wide = WIDE[rng.below(WIDE.len())];
                        doc.splice(at..at, wide.bytes());
                    }
                    _ => doc.insert(at, alphabet[rng.below(alphabet.len())]),
                }
            }
            let Ok(text) = std::str::from_utf8(&doc) else {
                continue;
            };
            if parse(text).is_some() {
                accepted += 1;
                if !text.is_ascii() {
                    accepted_wide += 1;
                }
            }
            assert!(agrees(text), "disagreement on {text:?}");
        }
        // The mutations must exercise the accepting path too, also with
        // non-ASCII text.
        assert!(accepted > 400, "only {accepted} mutated documents parsed");
        assert!(
            accepted_wide > 200,
            "only {accepted_wide} non-ASCII documents parsed"
        );
    }

    /// What ears-manager itself writes takes the fast path and reads back as
    /// written: the benchmark's speed depends on it.
    #[test]
    fn records_the_tool_writes_take_the_fast_path() {
        use crate::model::{
            AppliesTo, Artifact, Assessment, ChangeSet, Interface, InterfaceOp, Project,
            Relationship, Requirement, RequirementOp, Verification,
        };
        use crate::yaml::emit_managed;
        fn round_trip<T>(record: &T, node: &crate::node::Node)
        where
            T: DeserializeOwned + PartialEq + std::fmt::Debug,
        {
            let text = emit_managed(node);
            assert_eq!(decode::<T>(&text).as_ref(), Some(record), "{text}");
        }
        let texts = [
            "When a request arrives, the CLI shall answer.",
            "The CLI shall print \"ok\": always, #1 and 'quoted'; 100% = done?",
            "true",
            "null",
            "123",
            "- dash: colon",
            "trailing colon:",
            "back\\slash\ttab\nnewline",
            "Caf\u{e9} \u{2265} 5 \u{2014} ok \u{1F600}",
            "line\u{2028}sep\u{85}nel\u{feff}bom",
        ];
        for (i, text) in texts.iter().enumerate() {
            let mut r = Requirement {
                id: format!("REQ-CLI-{:05}", i + 1),
                kind: "event-driven".into(),
                text: (*text).to_owned(),
                applies_to: Some(AppliesTo {
                    interfaces: vec!["cli".into()],
                    scopes: vec!["project".into(), (*text).to_owned()],
                }),
                verification: Some(Verification {
                    mode: "implementation-aware".into(),
                    rationale: (*text).to_owned(),
                }),
                provenance: "user-authored".into(),
                created: "2026-09-15T12:00:00Z".into(),
                relationships: vec![Relationship {
                    kind: "depends-on".into(),
                    target: "REQ-CLI-00042".into(),
                }],
                status: String::new(),
            };
            r.canonicalize();
            round_trip(&r, &r.to_node());
            let mut it = Interface {
                id: "cli".into(),
                name: (*text).to_owned(),
                kind: "cli".into(),
                spec_approach: "OpenAPI 3.1".into(),
                description: (*text).to_owned(),
                created: "2026-09-15T12:00:00Z".into(),
                ..Interface::default()
            };
            it.canonicalize();
            round_trip(&it, &it.to_node());
            let base = "0123456789abcdef0123456789abcdef01234567".to_owned();
            let mut cs = ChangeSet {
                id: "CS-00001".into(),
                base_commit: base.clone(),
                intent: (*text).to_owned(),
                operations: Some(vec![RequirementOp {
                    action: "revise".into(),
                    requirement_id: "REQ-CLI-00001".into(),
                    rationale: (*text).to_owned(),
                }]),
                interface_operations: vec![InterfaceOp {
                    action: "add".into(),
                    interface_id: "cli".into(),
                    rationale: String::new(),
                }],
                affected_interfaces: Some(vec![]),
                affected_scopes: vec!["project".into()],
                implementation_required: Some(false),
                implementation_rationale: (*text).to_owned(),
                impact_assessment: vec![Assessment {
                    requirement_id: "REQ-CLI-00002".into(),
                    disposition: "applicable".into(),
                    rationale: (*text).to_owned(),
                    origin: "mechanical".into(),
                }],
                impact_assessment_base_commit: base,
                created: "2026-09-15T12:00:00Z".into(),
                ..ChangeSet::default()
            };
            cs.canonicalize();
            round_trip(&cs, &cs.to_node());
        }
        let mut project: Project = serde_yaml_ng::from_str(
            "schema_versions:\n  specification: 1\n  project: 1\nproject:\n  id: demo\n  name: Demo\nrepository:\n  canonical_remote: https://example.invalid/demo.git\n  review_mode: single-player\n",
        )
        .expect("project fixture");
        project.artifacts.push(Artifact {
            id: "vision".into(),
            kind: "vision".into(),
            path: "docs/vision.md".into(),
            digest: format!("sha256:{}", "a".repeat(64)),
            owner: "user".into(),
            validator: String::new(),
        });
        project.canonicalize();
        round_trip(&project, &project.to_node());
    }

    /// The typed decode either declines or yields what `from_value` over the
    /// full parser's tree yields.
    fn decode_agrees<T>(text: &str) -> bool
    where
        T: DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        match decode::<T>(text) {
            None => true,
            Some(fast) => {
                let full: Option<T> = full(text).and_then(|v| serde_yaml_ng::from_value(v).ok());
                full.as_ref() == Some(&fast) && super::super::check_anchors(text).is_ok()
            }
        }
    }

    #[test]
    fn typed_decodes_agree_with_from_value() {
        use crate::model::{ChangeSet, Interface, Project, Requirement};
        let req = CANONICAL[0].replace("# managed by ears-manager; do not edit by hand\n", "");
        let cs = "id: CS-00001\nbase_commit: \"0123456789abcdef0123456789abcdef01234567\"\nintent: Do it\noperations:\n  - action: revise\n    requirement_id: REQ-A-00001\naffected_interfaces: []\nimplementation_required: false\nimplementation_rationale: 'none'\nimpact_assessment: []\ncreated: \"2026-09-15T12:00:00Z\"\n";
        let iface =
            "id: cli\nname: CLI\ntype: cli\ncreated: \"2026-09-15T12:00:00Z\"\nstatus: active\n";
        let project = "schema_versions:\n  specification: 1\n  project: 1\nproject:\n  id: p\n  name: P\nrepository:\n  canonical_remote: https://h/x\n  review_mode: single-player\n";
        assert!(decode::<Requirement>(&req).is_some());
        assert!(decode::<ChangeSet>(cs).is_some());
        assert!(decode::<Interface>(iface).is_some());
        assert!(decode::<Project>(project).is_some());
        let docs = [req.as_str(), cs, iface, project];
        let alphabet: &[u8] = b" \n-:#'\"[]{}0123456789aetruefalsidxyz_";
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let mut accepted = 0usize;
        for round in 0..15_000 {
            let mut doc = docs[round % docs.len()].as_bytes().to_vec();
            for _ in 0..=rng.below(2) {
                let at = rng.below(doc.len() + 1);
                match rng.below(3) {
                    0 if at < doc.len() => {
                        doc.remove(at);
                    }
                    1 if at < doc.len() => doc[at] = alphabet[rng.below(alphabet.len())],
                    _ => doc.insert(at, alphabet[rng.below(alphabet.len())]),
                }
            }
            let Ok(text) = std::str::from_utf8(&doc) else {
                continue;
            };
            let ok = decode_agrees::<Requirement>(text)
                && decode_agrees::<ChangeSet>(text)
                && decode_agrees::<Interface>(text)
                && decode_agrees::<Project>(text);
            assert!(ok, "typed disagreement on {text:?}");
            if decode::<Requirement>(text).is_some() || decode::<ChangeSet>(text).is_some() {
                accepted += 1;
            }
        }
        assert!(accepted > 400, "only {accepted} mutated records decoded");
    }
}
