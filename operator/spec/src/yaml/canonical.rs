//! A fast parse path for the canonical record layout (issue 3 benchmark).
//!
//! Record files written by ears-manager (and by the Go `yaml.v3` writer) use
//! a small, regular subset of YAML: full-line comments at column 0, block
//! mappings with simple keys, block sequences (also the indentless form under
//! a key), plain scalars, single-line quoted scalars, `[]` and `{}`. This
//! module parses exactly that subset, line by line, into the same
//! [`Value`] the full parser would build.
//!
//! It is only a shortcut: whenever the input strays from the subset, or
//! anything could be read two ways, [`parse`] returns `None` and the caller
//! falls back to the full parser, which then produces the result (or the
//! error) exactly as before. A `Some` is therefore only ever returned for
//! inputs on which the full parser agrees (tested against it on generated
//! and mutated documents).

use serde_yaml_ng::{Mapping, Number, Value};

/// One content line: its indentation and the text after it.
#[derive(Clone, Copy)]
struct Line<'a> {
    indent: usize,
    text: &'a str,
}

/// Parses `text` when it is in the canonical subset.
pub(super) fn parse(text: &str) -> Option<Value> {
    // Printable ASCII and LF only: no tabs, CR, control or non-ASCII
    // characters, which all have reader-level rules of their own.
    if !text
        .bytes()
        .all(|b| b == b'\n' || (b' '..=b'~').contains(&b))
    {
        return None;
    }
    let mut lines = Vec::with_capacity(32);
    for raw in text.split_terminator('\n') {
        if raw.starts_with('#') {
            continue;
        }
        let body = raw.trim_start_matches(' ');
        if body.is_empty() || body.starts_with('#') || body.ends_with(' ') {
            return None;
        }
        lines.push(Line {
            indent: raw.len() - body.len(),
            text: body,
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
    fn node(&mut self, indent: usize) -> Option<Value> {
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

    fn mapping(&mut self, indent: usize) -> Option<Value> {
        let mut map = Mapping::new();
        while let Some(line) = self.peek() {
            if line.indent < indent {
                break;
            }
            if line.indent > indent || is_entry(line.text) {
                return None;
            }
            let (key, rest) = split_key(line.text)?;
            // Keys resolve like values: `true:` is a boolean key.
            let Value::String(key) = plain(key)? else {
                return None;
            };
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
            if map.insert(Value::String(key), value).is_some() {
                return None;
            }
        }
        Some(Value::Mapping(map))
    }

    fn sequence(&mut self, indent: usize) -> Option<Value> {
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
        Some(Value::Sequence(items))
    }
}

/// A complete single-line scalar (the whole rest of the line).
fn scalar(text: &str) -> Option<Value> {
    match text.as_bytes().first()? {
        b'"' => double_quoted(text).map(Value::String),
        b'\'' => single_quoted(text).map(Value::String),
        b'[' => (text == "[]").then(|| Value::Sequence(Vec::new())),
        b'{' => (text == "{}").then(|| Value::Mapping(Mapping::new())),
        b'0'..=b'9' => integer(text),
        _ => plain(text),
    }
}

/// Decimal integers without sign or leading zeros that fit a `u64`.
fn integer(text: &str) -> Option<Value> {
    if text.len() > 18 || !text.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if text.len() > 1 && text.starts_with('0') {
        return None;
    }
    text.parse::<u64>()
        .ok()
        .map(|n| Value::Number(Number::from(n)))
}

/// Plain scalars that can only be read as a string, a boolean or a null.
fn plain(text: &str) -> Option<Value> {
    let b = text.as_bytes();
    let first = *b.first()?;
    if !(first.is_ascii_alphabetic() || first == b'_' || first == b'/') {
        return None;
    }
    if !b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || b" _-./,()'?;=+%:".contains(c))
    {
        return None;
    }
    if text.ends_with(':') || text.contains(": ") || text.contains(" #") {
        return None;
    }
    Some(match text {
        "null" | "Null" | "NULL" => Value::Null,
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        _ => Value::String(text.to_owned()),
    })
}

/// `"…"` closed on the same line, with nothing after the closing quote.
/// Escapes: the JSON set; anything rarer goes to the full parser.
fn double_quoted(text: &str) -> Option<String> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
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
    Some(out)
}

/// `'…'` closed on the same line (`''` is a quote), nothing after it.
fn single_quoted(text: &str) -> Option<String> {
    let inner = text.strip_prefix('\'')?.strip_suffix('\'')?;
    let mut out = String::with_capacity(inner.len());
    let mut rest = inner;
    while let Some(i) = rest.find('\'') {
        if rest.as_bytes().get(i + 1) != Some(&b'\'') {
            return None;
        }
        out.push_str(&rest[..=i]);
        rest = &rest[i + 2..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(text: &str) -> Option<Value> {
        serde_yaml_ng::from_str::<Value>(text).ok()
    }

    /// The fast path either declines or agrees with the full parser.
    fn agrees(text: &str) -> bool {
        match parse(text) {
            None => true,
            Some(v) => full(text).as_ref() == Some(&v),
        }
    }

    const CANONICAL: &[&str] = &[
        "# managed by ears-manager; do not edit by hand\nid: REQ-CLI-00001\ntype: event-driven\ntext: When x arrives, the CLI shall answer.\napplies_to:\n  interfaces:\n    - cli\n  scopes:\n    - scope-1\nverification:\n  mode: isolated-interface\nprovenance: user-authored\ncreated: \"2026-09-15T12:00:00Z\"\nrelationships:\n  - type: depends-on\n    target: REQ-CLI-00002\n  - type: related-to\n    target: REQ-CLI-00003\nstatus: active\n",
        "id: CS-00001\noperations: []\naffected_interfaces: []\nimplementation_required: true\nimpact_assessment:\n  - requirement_id: REQ-A-00001\n    disposition: applicable\n    rationale: \"Tab\\there, quote \\\" and \\u00e9 \\u0085\"\n    origin: candidate\nmeta: {}\n",
        "schema_versions:\n    specification: 1\n    project: 1\nrepository:\n    canonical_remote: https://h/x\n    default_branch: main\napplies_to:\n    interfaces:\n        - cli\n        - web\nlist:\n- a\n- 'it''s'\nafter: x\n",
        "- a\n- b: c\n  d: e\n- f\n",
        "k: True\nn: 0\nm: 12345\nq: FALSE\nz: /root/x\nw: a:b\n",
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
        ] {
            assert!(parse(doc).is_none(), "accepted {doc:?}");
        }
    }

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
        let mut accepted = 0usize;
        for round in 0..40_000 {
            let mut doc = CANONICAL[round % CANONICAL.len()].as_bytes().to_vec();
            for _ in 0..=rng.below(3) {
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
            if parse(text).is_some() {
                accepted += 1;
            }
            assert!(agrees(text), "disagreement on {text:?}");
        }
        // The mutations must exercise the accepting path too.
        assert!(accepted > 1_000, "only {accepted} mutated documents parsed");
    }
}
