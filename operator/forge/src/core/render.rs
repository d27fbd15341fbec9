//! Text the Job Site writes on GitHub, made safe and rendered by code.
//!
//! Everything written to a pull request, an issue or a commit status passes [`sanitize`]:
//! GitHub "acting" text is neutralised (closing keywords that would close issues, `@mentions`
//! that would notify people, CI-skip tokens that would skip required checks), control
//! characters are dropped, and nothing can forge the Job Site's own marker comment. The
//! pull-request body is rendered from a typed [`InspectionSummary`], never from free text.

use std::fmt::Write as _;

/// GitHub refuses bodies over 65 536 characters; stay well inside.
pub const MAX_BODY_CHARS: usize = 60_000;

/// Words GitHub treats as "close the referenced issue" when followed by a reference.
const CLOSING_KEYWORDS: [&str; 9] = [
    "close", "closes", "closed", "fix", "fixes", "fixed", "resolve", "resolves", "resolved",
];

/// Tokens that make GitHub Actions (or other CI) skip a run.
const CI_SKIP_TOKENS: [&str; 8] = [
    "[skip ci]",
    "[ci skip]",
    "[no ci]",
    "[skip actions]",
    "[actions skip]",
    "***no_ci***",
    "[skip azurepipelines]",
    "[skip checks]",
];

/// The prefix of every marker comment the Job Site writes; untrusted text may never contain it.
pub const MARKER_PREFIX: &str = "<!-- protobot:";

/// Returns `text` with GitHub acting text neutralised, control characters (except newline and
/// tab) removed, and at most `max_chars` characters (an ellipsis marks a cut).
pub fn sanitize(text: &str, max_chars: usize) -> String {
    let cleaned: String = text
        .chars()
        .filter(|c| !c.is_control() || *c == '\n' || *c == '\t')
        .collect();
    let mut out = strip_ci_skip(&cleaned);
    out = neutralise_markers(&out);
    out = neutralise_mentions(&out);
    out = neutralise_closing_keywords(&out);
    truncate(&out, max_chars)
}

/// One line of sanitized text (newlines become spaces), for titles and status descriptions.
pub fn sanitize_line(text: &str, max_chars: usize) -> String {
    let one_line = text.replace(['\n', '\r', '\t'], " ");
    sanitize(&one_line, max_chars)
}

fn truncate(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

fn strip_ci_skip(text: &str) -> String {
    let mut out = text.to_string();
    for token in CI_SKIP_TOKENS {
        loop {
            let lower = out.to_ascii_lowercase();
            let Some(at) = lower.find(token) else { break };
            out.replace_range(at..at + token.len(), "");
        }
    }
    out
}

fn neutralise_markers(text: &str) -> String {
    // `<!--` starts any HTML comment: a hidden comment could carry a forged marker, so none
    // survives.
    text.replace("<!--", "< !--")
}

/// A mention is written as `` `@name` `` (code), which GitHub does not resolve; an e-mail
/// address (an `@` inside a word) stays as it is.
fn neutralise_mentions(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts_word = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '`');
        if c == '@' && starts_word {
            let mut j = i + 1;
            while j < chars.len()
                && (chars[j].is_ascii_alphanumeric() || chars[j] == '-' || chars[j] == '/')
            {
                j += 1;
            }
            if j > i + 1 {
                out.push('`');
                out.extend(&chars[i..j]);
                out.push('`');
                i = j;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// `fixes #12`, `Closes owner/repo#3` or `resolved https://…/issues/4`: the keyword is kept but
/// the reference loses its power (`#12` becomes `# 12`, a URL is wrapped in code).
fn neutralise_closing_keywords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut previous_was_keyword = false;
    for token in split_keep_whitespace(text) {
        if token.chars().all(char::is_whitespace) {
            out.push_str(token);
            continue;
        }
        let word = token
            .trim_end_matches([':', ','])
            .trim_start_matches(['(', '['])
            .to_ascii_lowercase();
        if previous_was_keyword && looks_like_reference(token) {
            if token.contains("://") {
                let _ = write!(out, "`{token}`");
            } else {
                out.push_str(&token.replacen('#', "# ", 1));
            }
        } else {
            out.push_str(token);
        }
        previous_was_keyword = CLOSING_KEYWORDS.contains(&word.as_str());
    }
    out
}

fn looks_like_reference(token: &str) -> bool {
    let t = token.trim_start_matches(['(', '[']);
    t.starts_with('#')
        || t.contains("://")
        || t.split_once('#').is_some_and(|(repo, n)| {
            repo.contains('/') && n.starts_with(|c: char| c.is_ascii_digit())
        })
}

fn split_keep_whitespace(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut in_space: Option<bool> = None;
    for (i, c) in text.char_indices() {
        let space = c.is_whitespace();
        match in_space {
            Some(s) if s != space => {
                parts.push(&text[start..i]);
                start = i;
            }
            _ => {}
        }
        in_space = Some(space);
    }
    if start < text.len() {
        parts.push(&text[start..]);
    }
    parts
}

/// One piece of evidence the pull request links to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvidenceLink {
    /// What it is (`findings snapshot`, `inspection report`).
    pub label: String,
    /// Where (an `https://` URL, or a path in the repository at the tested head).
    pub target: String,
}

/// What the pull-request body says: the inspection report of the tested candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InspectionSummary {
    /// The work item (`WI-…`).
    pub work_item_id: String,
    /// The change set it implements, when it has one.
    pub change_set_id: Option<String>,
    /// The tested head (the merge's expected-head guard).
    pub tested_head: String,
    /// Its product-tree digest.
    pub product_tree_digest: String,
    /// The sealed Inspection Run.
    pub inspection_run_id: String,
    /// Findings recorded in the run.
    pub findings: usize,
    /// Build cycles until the candidate passed.
    pub cycles: usize,
    /// Where the BuildWorkItem can be seen (console or API URL), when known.
    pub work_item_url: Option<String>,
    /// The evidence files.
    pub evidence: Vec<EvidenceLink>,
}

/// The pull request's title.
pub fn pull_request_title(summary: &InspectionSummary) -> String {
    let subject = match &summary.change_set_id {
        Some(cs) => format!("{}: implement {cs}", summary.work_item_id),
        None => format!("{}: land the tested work item", summary.work_item_id),
    };
    sanitize_line(&subject, 200)
}

/// The pull request's body: the inspection summary with links to the evidence, sanitized,
/// ending with the marker that identifies the work item.
pub fn pull_request_body(summary: &InspectionSummary, blob_base: &str) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "Landed by the protobot Job Site once every gate passed. Merge it only through the Job Site: it merges with the tested head as the expected-head guard.\n"
    );
    let _ = writeln!(body, "| | |\n|---|---|");
    let _ = writeln!(body, "| Work item | `{}` |", summary.work_item_id);
    if let Some(cs) = &summary.change_set_id {
        let _ = writeln!(body, "| Change set | `{cs}` |");
    }
    let _ = writeln!(body, "| Tested head | `{}` |", summary.tested_head);
    let _ = writeln!(
        body,
        "| Product-tree digest | `{}` |",
        summary.product_tree_digest
    );
    let _ = writeln!(
        body,
        "| Inspection run | `{}` (sealed, every finding terminal) |",
        summary.inspection_run_id
    );
    let _ = writeln!(body, "| Findings recorded | {} |", summary.findings);
    let _ = writeln!(body, "| Build cycles | {} |", summary.cycles);
    if let Some(url) = summary.work_item_url.as_deref().filter(|u| is_web_url(u)) {
        let _ = writeln!(
            body,
            "| BuildWorkItem | [{}]({url}) |",
            summary.work_item_id
        );
    }
    if !summary.evidence.is_empty() {
        let _ = writeln!(body, "\n### Evidence\n");
        for link in &summary.evidence {
            let target = if is_web_url(&link.target) {
                link.target.clone()
            } else {
                format!(
                    "{}/{}/{}",
                    blob_base.trim_end_matches('/'),
                    summary.tested_head,
                    link.target.trim_start_matches('/')
                )
            };
            let _ = writeln!(body, "- [{}]({target})", link.label);
        }
    }
    let mut body = sanitize(&body, MAX_BODY_CHARS - 200);
    let _ = write!(
        body,
        "\n{MARKER_PREFIX}pull-request work-item={} -->\n",
        marker_safe(&summary.work_item_id)
    );
    body
}

/// Whether `url` is an absolute `https://` (or `http://`) URL with no credentials in it.
pub fn is_web_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    !authority.is_empty()
        && !authority.contains('@')
        && !url.contains(char::is_whitespace)
        && !url.contains(['(', ')', '<', '>', '"'])
}

/// A work-item id as it may appear in a marker: only `[A-Za-z0-9._-]`.
pub fn marker_safe(id: &str) -> String {
    id.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn closing_keywords_lose_their_references() {
        let out = sanitize(
            "This fixes #12 and Closes: owner/repo#3, resolved https://x/issues/4",
            1000,
        );
        assert!(!out.contains("fixes #12"), "{out}");
        assert!(out.contains("fixes # 12"), "{out}");
        assert!(out.contains("owner/repo# 3"), "{out}");
        assert!(out.contains("`https://x/issues/4`"), "{out}");
        // A hash not after a closing keyword is untouched.
        assert_eq!(sanitize("see #12", 100), "see #12");
    }

    #[test]
    fn mentions_become_code_and_emails_stay() {
        assert_eq!(sanitize("ping @octocat now", 100), "ping `@octocat` now");
        assert_eq!(sanitize("@org/team", 100), "`@org/team`");
        assert_eq!(sanitize("a@b.example", 100), "a@b.example");
    }

    #[test]
    fn ci_skip_tokens_and_markers_are_removed() {
        let out = sanitize(
            "done [skip ci] [CI SKIP] <!-- protobot:escalation work-item=X -->",
            1000,
        );
        assert!(!out.to_ascii_lowercase().contains("skip ci"), "{out}");
        assert!(!out.to_ascii_lowercase().contains("ci skip"), "{out}");
        assert!(!out.contains(MARKER_PREFIX), "{out}");
    }

    #[test]
    fn control_characters_go_and_length_is_bounded() {
        assert_eq!(sanitize("a\u{7}b\u{1b}[31mc\nd", 100), "ab[31mc\nd");
        let long = "x".repeat(50);
        let cut = sanitize(&long, 10);
        assert_eq!(cut.chars().count(), 10);
        assert!(cut.ends_with('…'));
        assert_eq!(sanitize_line("a\nb", 10), "a b");
    }

    fn summary() -> InspectionSummary {
        InspectionSummary {
            work_item_id: "WI-00042".into(),
            change_set_id: Some("CS-00042".into()),
            tested_head: "a".repeat(40),
            product_tree_digest: "sha256:beef".into(),
            inspection_run_id: "run-1".into(),
            findings: 2,
            cycles: 1,
            work_item_url: Some("https://console.example/bwi/WI-00042".into()),
            evidence: vec![
                EvidenceLink {
                    label: "findings snapshot".into(),
                    target: ".protobot/attestations/WI-00042/findings.jsonl".into(),
                },
                EvidenceLink {
                    label: "bad".into(),
                    target: "https://user:pw@evil.example/x".into(),
                },
            ],
        }
    }

    #[test]
    fn pull_request_body_links_evidence_at_the_tested_head_and_ends_with_the_marker() {
        let s = summary();
        let body = pull_request_body(&s, "https://github.com/o/r/blob/");
        assert!(
            body.contains(&format!(
                "(https://github.com/o/r/blob/{}/.protobot/attestations/WI-00042/findings.jsonl)",
                s.tested_head
            )),
            "{body}"
        );
        assert!(body.contains("[WI-00042](https://console.example/bwi/WI-00042)"));
        assert!(body.contains("| Findings recorded | 2 |"));
        assert!(
            body.trim_end()
                .ends_with("<!-- protobot:pull-request work-item=WI-00042 -->")
        );
        // Exactly one marker: the rendered text cannot carry another.
        assert_eq!(body.matches(MARKER_PREFIX).count(), 1);
        assert_eq!(pull_request_title(&s), "WI-00042: implement CS-00042");
    }

    #[test]
    fn web_urls_with_credentials_or_odd_characters_are_refused() {
        assert!(is_web_url("https://github.com/o/r"));
        assert!(!is_web_url("https://user:pw@github.com/o/r"));
        assert!(!is_web_url("javascript:alert(1)"));
        assert!(!is_web_url("https://x/a b"));
        assert!(!is_web_url("https://x/a)(b"));
        // No `>`, `<`, `!` or space survives, so no comment can close early.
        assert_eq!(marker_safe("WI-1 --><!--"), "WI-1----");
    }
}
