//! Strict YAML decoding and canonical YAML writing (§4).
//!
//! Decoding parses into `serde_yaml_ng::Value` and then walks the tree to
//! refuse what the safe loader refuses: BOMs, several or empty documents,
//! tags, merge keys, non-string keys, explicit nulls and (lexically) anchors
//! and aliases. Duplicate keys are refused by `serde_yaml_ng` itself.
//!
//! Canonical record files take a fast path first (`canonical`), which
//! declines anything it is not sure about; the full path above then decides.
//!
//! Writing is our own small emitter: 2-space indentation, block sequences,
//! strings plain when that is unambiguous and JSON-style double-quoted
//! otherwise, LF line ends and exactly one final newline. Two writes of the
//! same logical content are byte-identical (the only requirement §4 pins).

use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

use crate::node::Node;

mod canonical;

/// First line of every record file the tool writes.
pub const MANAGED_HEADER: &str = "# managed by ears-manager; do not edit by hand";

/// Deepest nesting a governed file may have (records nest four or five levels).
pub const MAX_DEPTH: usize = 64;

/// Refuses text nested deeper than [`MAX_DEPTH`] before any parser sees it, in one linear
/// pass: block nesting (a stack of increasing indentations, plus compact `- - ` items) and
/// flow nesting (`[`/`{` outside quotes and comments). Either would otherwise cost a
/// recursive parser its stack, or a quadratic one its time.
pub fn check_depth(text: &str) -> Result<(), String> {
    let too_deep = || format!("the file nests deeper than {MAX_DEPTH} levels");
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    for line in text.lines() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let rest = &line[indent..];
        if flow == 0 && !rest.is_empty() && !rest.starts_with('#') {
            while indents.last().is_some_and(|top| *top >= indent) {
                indents.pop();
            }
            indents.push(indent);
            let mut compact = 0;
            let mut item = rest;
            while let Some(next) = item.strip_prefix("- ").or_else(|| item.strip_prefix("? ")) {
                compact += 1;
                item = next.trim_start_matches(' ');
            }
            if indents.len() + compact > MAX_DEPTH {
                return Err(too_deep());
            }
        }
        let mut quote: Option<char> = None;
        let mut escaped = false;
        let mut previous = ' ';
        for c in rest.chars() {
            match quote {
                Some('"') if escaped => escaped = false,
                Some('"') if c == '\\' => escaped = true,
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None => match c {
                    '#' if previous == ' ' || previous == '\t' => break,
                    '"' | '\'' if matches!(previous, ' ' | '\t' | '[' | '{' | ',' | ':') => {
                        quote = Some(c)
                    }
                    '[' | '{' => {
                        flow += 1;
                        if indents.len() + flow > MAX_DEPTH {
                            return Err(too_deep());
                        }
                    }
                    ']' | '}' => flow = flow.saturating_sub(1),
                    _ => {}
                },
            }
            previous = c;
        }
    }
    Ok(())
}

/// Parses bytes into a checked YAML value, or says why it cannot.
pub fn parse(bytes: &[u8]) -> Result<Value, String> {
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err("the file starts with a byte-order mark".to_owned());
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "the file is not valid UTF-8".to_owned())?;
    check_depth(text)?;
    check_anchors(text)?;
    // Canonical record files take a fast line-based path; anything else (or
    // anything it is unsure about) goes through the full parser.
    let value: Value = match canonical::parse(text) {
        Some(v) => v,
        None => serde_yaml_ng::from_str(text).map_err(|e| scrub(&e.to_string()))?,
    };
    if value.is_null() {
        return Err("the file holds no YAML document".to_owned());
    }
    check_value(&value, "")?;
    Ok(value)
}

/// Parses and strictly decodes a record type (unknown fields refused).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    // Canonical record files decode straight from the fast path's tree;
    // anything it declines (including every error) takes the full path, so
    // results and messages are unchanged. Whatever the fast path accepts
    // also passes `check_anchors` (asserted by its property tests), so the
    // lexical scan is not repeated here.
    if !bytes.starts_with(&[0xEF, 0xBB, 0xBF])
        && let Ok(text) = std::str::from_utf8(bytes)
        && check_depth(text).is_ok()
        && let Some(record) = canonical::decode(text)
    {
        return Ok(record);
    }
    let value = parse(bytes)?;
    if !value.is_mapping() {
        return Err("the document is not a mapping".to_owned());
    }
    serde_yaml_ng::from_value(value).map_err(|e| scrub(&e.to_string()))
}

/// Keeps decoder messages free of anything but the parser's own words.
fn scrub(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or("invalid YAML");
    first
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect()
}

/// Walks the tree; the location is only built when something is wrong, so
/// the common (valid) case allocates nothing.
fn check_value(value: &Value, _at: &str) -> Result<(), String> {
    walk(value).map_err(|(what, mut path)| {
        path.reverse();
        let at = if path.is_empty() {
            "the document root".to_owned()
        } else {
            path.join(".")
        };
        format!("{at} {what}")
    })
}

type WalkError = (&'static str, Vec<String>);

fn walk(value: &Value) -> Result<(), WalkError> {
    match value {
        Value::Null => Err(("is null; omit the key instead", Vec::new())),
        Value::Tagged(_) => Err(("carries an explicit tag", Vec::new())),
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item).map_err(|(w, mut p)| {
                    p.push(format!("[{i}]"));
                    (w, p)
                })?;
            }
            Ok(())
        }
        Value::Mapping(map) => {
            for (k, v) in map {
                let Value::String(key) = k else {
                    return Err(("has a non-string key", Vec::new()));
                };
                if key == "<<" {
                    return Err(("uses a merge key", Vec::new()));
                }
                walk(v).map_err(|(w, mut p)| {
                    p.push(key.clone());
                    (w, p)
                })?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Lexical refusal of anchors (`&x`), aliases (`*x`) and tags (`!x`) at node
/// positions outside quoted scalars, block scalars and comments. Plain
/// scalars cannot start with these indicators, so a hit at a node position
/// is the real thing. Block scalars (`|`, `>`, as Go's yaml.v3 writes
/// multi-line text) and multi-line quoted scalars are skipped; multi-line
/// plain scalars are not followed (neither writer emits them).
fn check_anchors(text: &str) -> Result<(), String> {
    // Indentation of the line that opened a block scalar.
    let mut block: Option<usize> = None;
    // Quote character of a quoted scalar still open at the end of a line.
    let mut open_quote: Option<u8> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        if let Some(key_indent) = block {
            if line.trim().is_empty() || indent > key_indent {
                continue;
            }
            block = None;
        }
        if let Some(q) = open_quote {
            if closes_quote(line.as_bytes(), q) {
                open_quote = None;
            }
            continue;
        }
        let mut rest = line.trim_start();
        while let Some(r) = rest.strip_prefix("- ") {
            rest = r.trim_start();
        }
        let value = find_value_start(rest).map_or(rest, |i| rest[i..].trim_start());
        for pos in [rest, value] {
            let pos = pos.trim_start();
            if pos.starts_with('[') || pos.starts_with('{') {
                for item in pos.split([',', '[', '{']) {
                    let item = item.trim_start();
                    let v = find_value_start(item).map_or(item, |i| item[i..].trim_start());
                    indicator(item)?;
                    indicator(v)?;
                }
            } else {
                indicator(pos)?;
            }
        }
        let value = value.trim_end();
        if value.starts_with('|') || value.starts_with('>') {
            block = Some(indent);
        } else if let Some(q @ (b'"' | b'\'')) = value.bytes().next()
            && !closes_quote(&value.as_bytes()[1..], q)
        {
            open_quote = Some(q);
        }
    }
    Ok(())
}

fn indicator(pos: &str) -> Result<(), String> {
    match pos.chars().next() {
        Some('&') => Err("the file uses a YAML anchor".to_owned()),
        Some('*') => Err("the file uses a YAML alias".to_owned()),
        Some('!') => Err("the file uses an explicit YAML tag".to_owned()),
        _ => Ok(()),
    }
}

/// Whether `b` contains the closing quote `q` (honouring `\\` escapes in
/// double quotes and `''` in single quotes).
fn closes_quote(b: &[u8], q: u8) -> bool {
    let mut i = 0;
    while i < b.len() {
        if q == b'"' && b[i] == b'\\' {
            i += 2;
            continue;
        }
        if b[i] == q {
            if q == b'\'' && b.get(i + 1) == Some(&b'\'') {
                i += 2;
                continue;
            }
            return true;
        }
        i += 1;
    }
    false
}

/// Byte offset just after the first `: ` (or a trailing `:`) outside quotes.
fn find_value_start(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(q) => {
                if c == b'\\' && q == b'"' {
                    i += 1;
                } else if c == q {
                    quote = None;
                }
            }
            None => {
                if (c == b'"' || c == b'\'') && (i == 0) {
                    quote = Some(c);
                } else if c == b'#' && (i == 0 || b[i - 1] == b' ') {
                    return None;
                } else if c == b':' && (i + 1 == b.len() || b[i + 1] == b' ') {
                    return Some(i + 1);
                }
            }
        }
        i += 1;
    }
    None
}

/// Renders a node as a canonical YAML document with the managed header.
pub fn emit_managed(node: &Node) -> String {
    let mut out = String::new();
    out.push_str(MANAGED_HEADER);
    out.push('\n');
    emit_into(node, &mut out);
    out
}

/// Renders a node as a canonical YAML document without a header.
pub fn emit(node: &Node) -> String {
    let mut out = String::new();
    emit_into(node, &mut out);
    out
}

fn emit_into(node: &Node, out: &mut String) {
    match node {
        Node::Map(entries) if !entries.is_empty() => emit_map(entries, 0, out),
        Node::List(items) if !items.is_empty() => emit_list(items, 0, out),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn pad(n: usize, out: &mut String) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn emit_map(entries: &[(String, Node)], indent: usize, out: &mut String) {
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            pad(indent, out);
        }
        out.push_str(&quote_key(k));
        out.push(':');
        emit_child(v, indent, out);
    }
}

fn emit_child(v: &Node, indent: usize, out: &mut String) {
    match v {
        Node::Map(e) if !e.is_empty() => {
            out.push('\n');
            pad(indent + 2, out);
            emit_map(e, indent + 2, out);
        }
        Node::List(items) if !items.is_empty() => {
            out.push('\n');
            pad(indent + 2, out);
            emit_list(items, indent + 2, out);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn emit_list(items: &[Node], indent: usize, out: &mut String) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            pad(indent, out);
        }
        out.push_str("- ");
        match item {
            Node::Map(e) if !e.is_empty() => emit_map(e, indent + 2, out),
            Node::List(inner) if !inner.is_empty() => emit_list(inner, indent + 2, out),
            other => {
                out.push_str(&scalar(other));
                out.push('\n');
            }
        }
    }
}

fn quote_key(k: &str) -> String {
    if is_plain_safe(k) {
        k.to_owned()
    } else {
        quoted(k)
    }
}

fn scalar(node: &Node) -> String {
    match node {
        Node::Null => "null".to_owned(),
        Node::Bool(b) => b.to_string(),
        Node::Int(i) => i.to_string(),
        Node::Str(s) => {
            if is_plain_safe(s) {
                s.clone()
            } else {
                quoted(s)
            }
        }
        Node::List(_) => "[]".to_owned(),
        Node::Map(_) => "{}".to_owned(),
    }
}

fn quoted(s: &str) -> String {
    // A JSON string literal is a valid YAML double-quoted scalar, except that
    // YAML also treats NEL, LS and PS as line breaks (and would fold them)
    // and a BOM is not printable: escape those explicitly.
    let json = serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned());
    json.replace('\u{85}', "\\u0085")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
        .replace('\u{feff}', "\\ufeff")
}

/// Plain style only for strings that cannot be read back as anything else.
fn is_plain_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if !(first.is_ascii_alphabetic() || first == '_' || first == '/') {
        return false;
    }
    if s.ends_with(' ') || s.ends_with(':') || s.contains(": ") || s.contains(" #") {
        return false;
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " _-./,()'?;=+%:".contains(c))
    {
        return false;
    }
    let lower = s.to_ascii_lowercase();
    !matches!(
        lower.as_str(),
        "true" | "false" | "yes" | "no" | "on" | "off" | "y" | "n" | "null"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_nested_structures_and_reads_them_back() {
        let node = Node::map()
            .with("id", Node::s("REQ-CLI-00001"))
            .with(
                "text",
                Node::s("When x: y, the CLI shall \"z\".\nNext\u{2028}LS\u{85}NEL\u{feff}\tTab é"),
            )
            .with("created", Node::s("2026-09-15T12:03:00Z"))
            .with("list", Node::strs(["a", "true", "1"]))
            .with("empty", Node::List(vec![]))
            .with(
                "maps",
                Node::List(vec![
                    Node::map()
                        .with("a", Node::s("b"))
                        .with("c", Node::Bool(true)),
                ]),
            )
            .with("nested", Node::map().with("k", Node::Int(1)));
        let text = emit_managed(&node);
        assert!(text.starts_with(MANAGED_HEADER));
        assert!(text.ends_with("\n") && !text.ends_with("\n\n"));
        let back = parse(text.as_bytes()).unwrap();
        assert_eq!(
            back["text"].as_str(),
            Some("When x: y, the CLI shall \"z\".\nNext\u{2028}LS\u{85}NEL\u{feff}\tTab é")
        );
        assert_eq!(back["list"][1].as_str(), Some("true"));
        assert_eq!(back["list"][2].as_str(), Some("1"));
        assert_eq!(back["created"].as_str(), Some("2026-09-15T12:03:00Z"));
        assert_eq!(back["maps"][0]["c"].as_bool(), Some(true));
        assert_eq!(back["nested"]["k"].as_i64(), Some(1));
        assert_eq!(emit_managed(&node), text);
    }

    #[test]
    fn deep_nesting_is_refused_in_linear_time() {
        let block: String = (0..200).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
        assert!(parse(block.as_bytes()).is_err());
        let flow = format!("x: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let started = std::time::Instant::now();
        assert!(parse(flow.as_bytes()).unwrap_err().contains("nests deeper"));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let compact = format!("x:\n{}a\n", "- ".repeat(100));
        assert!(parse(compact.as_bytes()).is_err());
        // Brackets inside quotes and comments are text.
        let quoted = format!("x: \"{}\" # {}\n", "[".repeat(100), "{".repeat(100));
        assert!(parse(quoted.as_bytes()).is_ok());
        let ok = "a:\n  b:\n    - c: [1, {d: 2}]\n";
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn refuses_unsafe_yaml() {
        for bad in [
            "\u{feff}a: b\n",
            "a: &x b\nc: *x\n",
            "a: !custom b\n",
            "a: !!str b\n",
            "base: {x: 1}\nm:\n  <<: {y: 1}\n",
            "a: b\na: c\n",
            "1: b\n",
            "a: null\n",
            "a:\n",
            "",
            "# only a comment\n",
            "a: b\n---\nc: d\n",
            "a: [*x]\n",
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "accepted {bad:?}");
        }
        assert!(parse(b"\xff\xfe").is_err());
        assert!(parse(b"a: |-\n    * bullet\n    &amp; !bang\nb: >\n  *x\nc: ok\n").is_ok());
        assert!(parse(b"a: \"line one\n  *still text\"\nb: 'x\n  &y'\n").is_ok());
        assert!(parse(b"a: |\n  text\nb: *alias\n").is_err());
        assert!(parse(b"- &anchor x\n").is_err());
        assert!(parse("a: 'it''s *fine* & ok'\nb: \"&no\"\n".as_bytes()).is_ok());
    }
}
