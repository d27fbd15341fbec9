//! One escalation issue per work item: title, body, marker, and the open-or-update decision.
//!
//! The issue is found again by its label ([`ESCALATION_LABEL`]) and a hidden marker comment
//! naming the work item, so a retried escalation updates the issue it opened instead of
//! opening a second one. A closed issue of a still-blocked item is reopened: closing the issue
//! never resolves the block (only the lifecycle does, `protobot retry` or a change set).

use super::{
    render::{MARKER_PREFIX, marker_safe, sanitize, sanitize_line},
    wire::Issue,
};

/// The label every escalation issue carries.
pub const ESCALATION_LABEL: &str = "protobot-escalation";

/// The hidden marker that names the work item in the issue body.
pub fn marker(work_item_id: &str) -> String {
    format!(
        "{MARKER_PREFIX}escalation work-item={} -->",
        marker_safe(work_item_id)
    )
}

/// What a person is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Escalation {
    /// The work item.
    pub work_item_id: String,
    /// Why it is blocked (sanitized again here).
    pub reason: String,
    /// The decision a person must make.
    pub decision: String,
    /// Where the BuildWorkItem can be seen, when known.
    pub work_item_url: Option<String>,
}

/// The issue's title.
pub fn title(escalation: &Escalation) -> String {
    sanitize_line(
        &format!(
            "protobot: work item {} is blocked",
            marker_safe(&escalation.work_item_id)
        ),
        200,
    )
}

/// The issue's body, ending with the marker.
pub fn body(escalation: &Escalation) -> String {
    let mut text = format!(
        "The protobot Job Site stopped work item `{}` and needs a decision.\n\n### Why\n\n{}\n\n### What to decide\n\n{}\n\nClosing this issue does not unblock the item: resolve it through the lifecycle (`protobot retry`, `protobot abandon`, or a change set that answers the question).\n",
        marker_safe(&escalation.work_item_id),
        escalation.reason,
        escalation.decision,
    );
    if let Some(url) = escalation
        .work_item_url
        .as_deref()
        .filter(|u| super::render::is_web_url(u))
    {
        text.push_str(&format!("\nBuildWorkItem: {url}\n"));
    }
    let mut body = sanitize(&text, super::render::MAX_BODY_CHARS - 200);
    body.push('\n');
    body.push_str(&marker(&escalation.work_item_id));
    body.push('\n');
    body
}

/// What to do on GitHub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IssueAction {
    /// No issue of this work item exists: create one.
    Create,
    /// Update issue `number` (and reopen it when `reopen`).
    Update {
        /// The issue.
        number: u64,
        /// It was closed.
        reopen: bool,
    },
}

/// Decides from the labelled issues listed (every page, open and closed). Pull requests,
/// which the issues API lists too, never count. With several marked issues (opened by hand),
/// the lowest number wins, so the choice is stable.
pub fn decide(work_item_id: &str, issues: &[Issue]) -> IssueAction {
    let wanted = marker(work_item_id);
    issues
        .iter()
        .filter(|i| i.pull_request.is_none())
        .filter(|i| {
            i.body
                .as_deref()
                .is_some_and(|b| b.lines().any(|l| l.trim() == wanted))
        })
        .min_by_key(|i| i.number)
        .map_or(IssueAction::Create, |i| IssueAction::Update {
            number: i.number,
            reopen: i.state != "open",
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn issue(number: u64, state: &str, body: Option<String>) -> Issue {
        Issue {
            number,
            state: state.into(),
            body,
            pull_request: None,
        }
    }

    fn esc(reason: &str) -> Escalation {
        Escalation {
            work_item_id: "WI-00042".into(),
            reason: reason.into(),
            decision: "Fix the check, then run `protobot retry`.".into(),
            work_item_url: None,
        }
    }

    #[test]
    fn the_body_carries_exactly_one_marker_even_if_the_reason_forges_one() {
        let forged = format!("bad {} @ops fixes #3", marker("WI-00042"));
        let b = body(&esc(&forged));
        assert_eq!(b.matches(MARKER_PREFIX).count(), 1, "{b}");
        assert!(b.trim_end().ends_with(&marker("WI-00042")));
        assert!(b.contains("`@ops`"), "{b}");
        assert!(b.contains("fixes # 3"), "{b}");
        assert_eq!(title(&esc("x")), "protobot: work item WI-00042 is blocked");
    }

    #[test]
    fn the_issue_is_found_again_by_its_marker_and_reopened_when_closed() {
        let mine = body(&esc("r"));
        let other = body(&Escalation {
            work_item_id: "WI-00043".into(),
            ..esc("r")
        });
        assert_eq!(decide("WI-00042", &[]), IssueAction::Create);
        assert_eq!(
            decide("WI-00042", &[issue(5, "open", Some(other.clone()))]),
            IssueAction::Create
        );
        assert_eq!(
            decide(
                "WI-00042",
                &[
                    issue(9, "closed", Some(mine.clone())),
                    issue(5, "open", Some(other))
                ]
            ),
            IssueAction::Update {
                number: 9,
                reopen: true
            }
        );
        assert_eq!(
            decide(
                "WI-00042",
                &[
                    issue(12, "open", Some(mine.clone())),
                    issue(11, "open", Some(mine.clone()))
                ]
            ),
            IssueAction::Update {
                number: 11,
                reopen: false
            }
        );
        // A marker quoted inside a line, or a pull request with the marker, does not count.
        let quoted = format!("> {}", marker("WI-00042"));
        let mut pr = issue(3, "open", Some(mine));
        pr.pull_request = Some(serde_json::json!({}));
        assert_eq!(
            decide(
                "WI-00042",
                &[issue(2, "open", Some(quoted)), pr, issue(4, "open", None)]
            ),
            IssueAction::Create
        );
        // Another id that merely starts the same does not match.
        assert_eq!(
            decide("WI-0004", &[issue(9, "open", Some(body(&esc("r"))))]),
            IssueAction::Create
        );
    }
}
