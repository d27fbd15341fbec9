//! Commit statuses per stage (`POST /repos/{o}/{r}/statuses/{sha}`): one context per stage
//! (`protobot/building`, `protobot/integration`, `protobot/inspection`, `protobot/merge`), a
//! sanitized description within GitHub's 140 characters, and a target URL naming the
//! BuildWorkItem.

use serde::Serialize;

use super::render::{is_web_url, sanitize_line};

/// GitHub truncates longer descriptions; stay inside.
pub const MAX_DESCRIPTION: usize = 140;

/// A Job Site stage that reports a status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Workers writing tests and code.
    Building,
    /// The integration run (build + active test catalog).
    Integration,
    /// The Inspection Run.
    Inspection,
    /// Landing on the default branch.
    Merge,
}

impl Stage {
    /// The status context.
    pub fn context(self) -> &'static str {
        match self {
            Stage::Building => "protobot/building",
            Stage::Integration => "protobot/integration",
            Stage::Inspection => "protobot/inspection",
            Stage::Merge => "protobot/merge",
        }
    }
}

/// A status state (GitHub's four).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StageState {
    /// Running.
    Pending,
    /// Passed.
    Success,
    /// Failed on its merits.
    Failure,
    /// Could not run.
    Error,
}

/// The request body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StatusBody {
    /// State.
    pub state: StageState,
    /// Link (the BuildWorkItem); omitted when none is known or it is not a plain web URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_url: Option<String>,
    /// Short description.
    pub description: String,
    /// Context.
    pub context: String,
}

/// The status of `stage` for the work item.
pub fn status_body(
    stage: Stage,
    state: StageState,
    description: &str,
    work_item_url: Option<&str>,
) -> StatusBody {
    StatusBody {
        state,
        target_url: work_item_url.filter(|u| is_web_url(u)).map(str::to_string),
        description: sanitize_line(description, MAX_DESCRIPTION),
        context: stage.context().to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_status_names_its_stage_and_links_the_work_item() {
        let b = status_body(
            Stage::Inspection,
            StageState::Pending,
            "inspection run WI-1-r1 started",
            Some("https://console.example/ns/default/buildworkitems/wi-1"),
        );
        let json = serde_json::to_value(&b).unwrap();
        assert_eq!(json["context"], "protobot/inspection");
        assert_eq!(json["state"], "pending");
        assert_eq!(
            json["target_url"],
            "https://console.example/ns/default/buildworkitems/wi-1"
        );
        let long = status_body(
            Stage::Merge,
            StageState::Failure,
            &"x".repeat(500),
            Some("javascript:x"),
        );
        assert_eq!(long.description.chars().count(), MAX_DESCRIPTION);
        assert_eq!(long.target_url, None);
        assert!(!serde_json::to_string(&long).unwrap().contains("target_url"));
    }
}
