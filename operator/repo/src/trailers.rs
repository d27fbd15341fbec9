//! Commit-message trailers the Job Site writes and later searches for.
//!
//! Pure. Trailers are `Key: value` lines in the last paragraph of a message. Values are
//! forced onto one line; text the Job Site copies from untrusted Worker messages has any line
//! that looks like one of our trailers neutralised, so a Worker cannot forge a `Work-Item:`.

/// Trailer naming the work item.
pub const WORK_ITEM: &str = "Work-Item";
/// Trailer naming the integration cycle.
pub const CYCLE: &str = "Cycle";
/// Trailer naming the projection role.
pub const PROJECTION_ROLE: &str = "Projection-Role";
/// Trailer naming the synthetic root of the projection.
pub const PROJECTION_ROOT: &str = "Projection-Root";
/// Trailer naming a projection commit.
pub const PROJECTION_COMMIT: &str = "Projection-Commit";
/// Trailer with a patch-bundle digest.
pub const PATCH_DIGEST: &str = "Patch-Digest";
/// Trailer with the sanitized triage decision.
pub const TRIAGE_DECISION: &str = "Triage-Decision";
/// Trailer with the product-tree digest.
pub const PRODUCT_TREE_DIGEST: &str = "Product-Tree-Digest";
/// Trailer naming the source commit of the work item.
pub const SOURCE_COMMIT: &str = "Source-Commit";

const OURS: [&str; 9] = [
    WORK_ITEM,
    CYCLE,
    PROJECTION_ROLE,
    PROJECTION_ROOT,
    PROJECTION_COMMIT,
    PATCH_DIGEST,
    TRIAGE_DECISION,
    PRODUCT_TREE_DIGEST,
    SOURCE_COMMIT,
];

/// Builds `subject\n\n[body\n\n]Key: value\n…`.
pub fn compose(subject: &str, body: Option<&str>, trailers: &[(&str, String)]) -> String {
    let mut out = one_line(subject);
    out.push_str("\n\n");
    if let Some(body) = body.filter(|b| !b.trim().is_empty()) {
        out.push_str(body.trim_end());
        out.push_str("\n\n");
    }
    for (key, value) in trailers {
        out.push_str(key);
        out.push_str(": ");
        out.push_str(&one_line(value));
        out.push('\n');
    }
    out
}

/// Parses the trailers of the last paragraph of `message`.
pub fn parse(message: &str) -> Vec<(String, String)> {
    let trimmed = message.trim_end();
    let last = trimmed.rsplit("\n\n").next().unwrap_or_default();
    let mut out = Vec::new();
    for line in last.lines() {
        match line.split_once(": ") {
            Some((key, value))
                if !key.is_empty()
                    && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') =>
            {
                out.push((key.to_owned(), value.to_owned()));
            }
            _ => return Vec::new(),
        }
    }
    out
}

/// The value of trailer `key`, if present exactly once or more (first wins).
pub fn value<'a>(trailers: &'a [(String, String)], key: &str) -> Option<&'a str> {
    trailers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v.as_str())
}

/// Rewrites every line of untrusted text that starts like one of our trailers (`Key:`), so it
/// can be quoted in a Job Site commit without being read back as a trailer. Control characters
/// other than newlines and tabs (NUL above all, which no commit message can hold) are dropped.
pub fn neutralise(untrusted: &str) -> String {
    let visible: String = untrusted
        .chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\t'))
        .collect();
    visible
        .lines()
        .map(|line| {
            let head = line.trim_start();
            // Compared as bytes: the keys are ASCII, and a byte offset inside a multi-byte
            // character of Worker text must not panic.
            let bytes = head.as_bytes();
            if OURS.iter().any(|k| {
                bytes.len() > k.len()
                    && bytes[..k.len()].eq_ignore_ascii_case(k.as_bytes())
                    && bytes[k.len()] == b':'
            }) {
                format!("> {line}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ").trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_then_parse_round_trips() {
        let message = compose(
            "Merge WI-00042",
            Some("body text"),
            &[(WORK_ITEM, "WI-00042".into()), (CYCLE, "2\nextra".into())],
        );
        let trailers = parse(&message);
        assert_eq!(value(&trailers, WORK_ITEM), Some("WI-00042"));
        assert_eq!(value(&trailers, CYCLE), Some("2 extra"));
    }

    #[test]
    fn a_paragraph_with_prose_has_no_trailers() {
        assert!(parse("subject\n\nWork-Item: WI-1\nsome prose").is_empty());
    }

    #[test]
    fn multi_byte_worker_text_never_panics() {
        for text in [
            "Work-Ite\u{20ac}: x",
            "Cycl\u{e9}: 1",
            "\u{1F600}\u{1F600}\u{1F600}",
        ] {
            assert_eq!(neutralise(text), text);
        }
        assert_eq!(neutralise(" cycle: 2"), ">  cycle: 2");
        assert_eq!(neutralise("a\0b\r\u{7}c\td"), "abc\td");
    }

    #[test]
    fn forged_trailers_in_worker_text_are_neutralised() {
        let text = neutralise("fix\n\nwork-item: WI-9\nSigned-off-by: x");
        assert!(text.contains("> work-item: WI-9"));
        assert!(text.contains("\nSigned-off-by: x"));
        let composed = compose("Apply", Some(&text), &[]);
        assert!(value(&parse(&composed), WORK_ITEM).is_none());
    }
}
