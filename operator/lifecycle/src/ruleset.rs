//! The validation-rules/v1 ruleset as data.
//!
//! The transition table, role families, fenced commands and reconciliation
//! evidence pairs live in `ruleset/validation-rules-v1.json`, embedded in the
//! binary. The evaluator asks this module *what* is legal; it decides *whether*
//! a given request meets it. Changing v1 semantics needs a new ruleset version.

use std::{collections::BTreeMap, sync::LazyLock};

use serde::Deserialize;

use crate::vocab::{Command, Role, State};

/// The embedded ruleset document.
pub const RULESET_V1_JSON: &str = include_str!("../ruleset/validation-rules-v1.json");

/// The only rule version this evaluator implements.
pub const RULE_VERSION: &str = "validation-rules/v1";

/// The ruleset could not be loaded: a build defect, never a user error.
#[derive(Debug, thiserror::Error)]
pub enum RulesetError {
    /// The embedded JSON does not parse.
    #[error("failed to parse the embedded ruleset: {0}")]
    Parse(#[from] serde_json::Error),
    /// The document parses but is inconsistent.
    #[error("the embedded ruleset is inconsistent: {0}")]
    Inconsistent(String),
}

/// Required reconciliation evidence for a command/role row.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct EvidencePair {
    /// `reconciliation.status`.
    pub status: String,
    /// `reconciliation.git_mutation`.
    pub git_mutation: String,
}

/// One row of the closed transition table.
#[derive(Clone, Debug, Deserialize)]
pub struct TransitionRule {
    /// The command.
    pub command: Command,
    /// The role whose family performs this row.
    pub role: Role,
    /// States the command may start from.
    pub from: Vec<State>,
    /// Possible destinations (`same` = the from-state).
    pub to: Vec<Destination>,
    /// Whether entering the destination mints a fresh fencing token.
    #[serde(default)]
    pub issues_fence: bool,
    /// WMS-observed reconciliation evidence this row requires.
    #[serde(default)]
    pub evidence: Option<EvidencePair>,
}

/// A destination of a transition row.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Destination {
    /// The state is unchanged (`renew-lease`).
    Same(SameMarker),
    /// A named state.
    State(State),
}

/// The literal `"same"`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum SameMarker {
    /// `"same"`.
    #[serde(rename = "same")]
    Same,
}

#[derive(Debug, Deserialize)]
struct RulesetDoc {
    rule_version: String,
    default_lease_seconds: i64,
    terminal_states: Vec<State>,
    inspection_evidence_kept_in: Vec<State>,
    role_families: BTreeMap<Role, Vec<Command>>,
    preflight_roles: Vec<Role>,
    job_site_fenced_commands: Vec<Command>,
    transitions: Vec<TransitionRule>,
}

/// The loaded, checked ruleset.
#[derive(Debug)]
pub struct Ruleset {
    doc: RulesetDoc,
}

static V1: LazyLock<Result<Ruleset, String>> =
    LazyLock::new(|| Ruleset::parse(RULESET_V1_JSON).map_err(|e| e.to_string()));

impl Ruleset {
    /// The embedded validation-rules/v1 ruleset.
    pub fn v1() -> Result<&'static Ruleset, RulesetError> {
        V1.as_ref()
            .map_err(|e| RulesetError::Inconsistent(e.clone()))
    }

    /// Parses and checks a ruleset document.
    pub fn parse(json: &str) -> Result<Ruleset, RulesetError> {
        let doc: RulesetDoc = serde_json::from_str(json)?;
        if doc.rule_version != RULE_VERSION {
            return Err(RulesetError::Inconsistent(format!(
                "rule_version is {:?}, this evaluator implements {RULE_VERSION}",
                doc.rule_version
            )));
        }
        for rule in &doc.transitions {
            let family = doc
                .role_families
                .get(&rule.role)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            if !family.contains(&rule.command) {
                return Err(RulesetError::Inconsistent(format!(
                    "transition {} is not in the {} family",
                    rule.command, rule.role
                )));
            }
        }
        for command in Command::ALL {
            if !doc.transitions.iter().any(|r| r.command == *command) {
                return Err(RulesetError::Inconsistent(format!(
                    "command {command} has no row"
                )));
            }
        }
        Ok(Ruleset { doc })
    }

    /// `validation-rules/v1`.
    pub fn rule_version(&self) -> &str {
        &self.doc.rule_version
    }

    /// Lease duration used when the deployment configures none.
    pub fn default_lease_seconds(&self) -> i64 {
        self.doc.default_lease_seconds
    }

    /// The lifecycle family of a role.
    pub fn family(&self, role: Role) -> &[Command] {
        self.doc
            .role_families
            .get(&role)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Whether the role may call `lifecycle.preflight`.
    pub fn may_preflight(&self, role: Role) -> bool {
        self.doc.preflight_roles.contains(&role)
    }

    /// Whether a Job Site caller must present a live fence for this command.
    pub fn is_fenced_for_job_site(&self, command: Command) -> bool {
        self.doc.job_site_fenced_commands.contains(&command)
    }

    /// Whether the state is terminal.
    pub fn is_terminal(&self, state: State) -> bool {
        self.doc.terminal_states.contains(&state)
    }

    /// Whether a transition into `state` keeps the observed inspection evidence.
    pub fn keeps_inspection_evidence(&self, state: State) -> bool {
        self.doc.inspection_evidence_kept_in.contains(&state)
    }

    /// The row for (command, role), whatever the from-state.
    pub fn rule(&self, command: Command, role: Role) -> Option<&TransitionRule> {
        self.doc
            .transitions
            .iter()
            .find(|r| r.command == command && r.role == role)
    }

    /// All rows.
    pub fn transitions(&self) -> &[TransitionRule] {
        &self.doc.transitions
    }

    /// Sorted, de-duplicated commands legal from `state` for any role.
    pub fn allowed_operations(&self, state: State) -> Vec<Command> {
        let mut out: Vec<Command> = self
            .doc
            .transitions
            .iter()
            .filter(|r| r.from.contains(&state))
            .map(|r| r.command)
            .collect();
        out.sort_by_key(|c| c.as_str());
        out.dedup();
        out
    }

    /// Every legal (command, from-state, role) triple: the 25 (command, from)
    /// pairs of the contract, split by role where a command has two rows.
    pub fn legal_triples(&self) -> Vec<(Command, State, Role)> {
        let mut out = Vec::new();
        for r in &self.doc.transitions {
            for from in &r.from {
                out.push((r.command, *from, r.role));
            }
        }
        out
    }
}
