//! The six EARS patterns (contract §9). Matching is case-insensitive,
//! dot-matches-newline and anchored, like the Go regexes; word boundaries are
//! ASCII-only (`(?-u:\b)`) because Go's `\b` is ASCII-only.

use std::sync::LazyLock;

use regex::Regex;

/// Requirement types that name an EARS pattern.
pub const TYPES: [&str; 6] = [
    "ubiquitous",
    "event-driven",
    "state-driven",
    "unwanted-behavior",
    "optional-feature",
    "complex",
];

struct Patterns {
    ubiquitous: Regex,
    event: Regex,
    state: Regex,
    unwanted: Regex,
    optional: Regex,
    shall: Regex,
    when: Regex,
    while_: Regex,
    where_: Regex,
    if_then: Regex,
}

// The sources are constants covered by the tests below, so compiling them
// cannot fail at run time.
#[allow(clippy::expect_used)]
fn compile(src: &str) -> Regex {
    Regex::new(src).expect("constant EARS pattern compiles")
}

static PATTERNS: LazyLock<Patterns> = LazyLock::new(|| Patterns {
    ubiquitous: compile(r"(?is)^The .+ shall .+$"),
    event: compile(r"(?is)^When .+, the .+ shall .+$"),
    state: compile(r"(?is)^While .+, the .+ shall .+$"),
    unwanted: compile(r"(?is)^If .+, then the .+ shall .+$"),
    optional: compile(r"(?is)^Where .+, the .+ shall .+$"),
    shall: compile(r"(?i)(?-u:\b)shall(?-u:\b)"),
    when: compile(r"(?i)(?-u:\b)when(?-u:\b)"),
    while_: compile(r"(?i)(?-u:\b)while(?-u:\b)"),
    where_: compile(r"(?i)(?-u:\b)where(?-u:\b)"),
    if_then: compile(r"(?is)(?-u:\b)if(?-u:\b).*(?-u:\b)then(?-u:\b)"),
});

/// Whether `text` matches the pattern of requirement type `kind`. Unknown
/// types never match.
pub fn matches(kind: &str, text: &str) -> bool {
    let p = &*PATTERNS;
    match kind {
        "ubiquitous" => p.ubiquitous.is_match(text),
        "event-driven" => p.event.is_match(text),
        "state-driven" => p.state.is_match(text),
        "unwanted-behavior" => p.unwanted.is_match(text),
        "optional-feature" => p.optional.is_match(text),
        "complex" => {
            let triggers = [&p.when, &p.while_, &p.where_, &p.if_then]
                .iter()
                .filter(|r| r.is_match(text))
                .count();
            p.shall.is_match(text) && triggers >= 2
        }
        _ => false,
    }
}

/// The message for a mismatch (fixture wording, §26).
pub fn mismatch_message(kind: &str) -> String {
    if TYPES.contains(&kind) {
        format!("Text does not match the declared {kind} pattern.")
    } else {
        "Text cannot be checked because the requirement type is not a supported EARS pattern."
            .to_owned()
    }
}

/// The per-pattern hint (§9).
pub fn hint(kind: &str) -> &'static str {
    match kind {
        "ubiquitous" => "Write the statement as 'The ... shall ...'.",
        "event-driven" => "Start the statement with 'When ...'.",
        "state-driven" => "Start the statement with 'While ...'.",
        "optional-feature" => "Start the statement with 'Where ...'.",
        "unwanted-behavior" => "Write the statement as 'If ..., then the ... shall ...'.",
        "complex" => {
            "Include 'shall' and at least two of the trigger forms when, while, where, if ... then."
        }
        _ => "Declare one of the supported EARS patterns as the requirement type.",
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn ubiquitous_accepts_and_rejects() {
        assert!(matches("ubiquitous", "The CLI shall print usage."));
        assert!(matches("ubiquitous", "THE CLI SHALL PRINT USAGE."));
        assert!(!matches("ubiquitous", "A CLI shall print usage."));
        assert!(!matches("ubiquitous", "The CLI must print usage."));
        assert!(!matches("ubiquitous", "The CLI shallprint usage."));
    }

    #[test]
    fn event_driven_accepts_and_rejects() {
        assert!(matches(
            "event-driven",
            "When the user asks for help, the CLI shall print usage."
        ));
        assert!(matches("event-driven", "WHEN X, THE CLI SHALL PRINT."));
        assert!(!matches(
            "event-driven",
            "When the user asks for help the CLI shall print usage."
        ));
        assert!(!matches(
            "event-driven",
            "Whenever asked, the CLI shall print usage."
        ));
        assert!(!matches(
            "event-driven",
            "This does not use the event-driven EARS form."
        ));
    }

    #[test]
    fn state_driven_accepts_and_rejects() {
        assert!(matches(
            "state-driven",
            "While offline, the CLI shall queue writes."
        ));
        assert!(!matches(
            "state-driven",
            "Whilst offline, the CLI shall queue writes."
        ));
        assert!(!matches(
            "state-driven",
            "While offline the CLI shall queue writes."
        ));
    }

    #[test]
    fn unwanted_behavior_accepts_and_rejects() {
        assert!(matches(
            "unwanted-behavior",
            "If the disk is full, then the CLI shall stop."
        ));
        assert!(!matches(
            "unwanted-behavior",
            "If the disk is full, the CLI shall stop."
        ));
        assert!(!matches(
            "unwanted-behavior",
            "If the disk is full then the CLI shall stop."
        ));
    }

    #[test]
    fn optional_feature_accepts_and_rejects() {
        assert!(matches(
            "optional-feature",
            "Where colour is enabled, the CLI shall colour output."
        ));
        assert!(!matches(
            "optional-feature",
            "Wherever colour is enabled, the CLI shall colour output."
        ));
        assert!(!matches(
            "optional-feature",
            "Where colour is enabled the CLI shall colour output."
        ));
    }

    #[test]
    fn complex_needs_shall_and_two_distinct_triggers() {
        assert!(matches(
            "complex",
            "While online, when a file changes, the CLI shall sync it."
        ));
        assert!(matches(
            "complex",
            "Where sync is on, if a conflict occurs then the CLI shall stop."
        ));
        assert!(!matches(
            "complex",
            "When a file changes, the CLI shall sync it."
        ));
        assert!(!matches(
            "complex",
            "When a file changes and when a dir changes, the CLI shall sync."
        ));
        assert!(!matches(
            "complex",
            "While online, when a file changes, the CLI will sync it."
        ));
        assert!(!matches("complex", "Then if x, while y, the CLI shall z."));
    }

    #[test]
    fn word_boundaries_are_ascii_only_like_go() {
        // 'é' is not an ASCII word character, so Go's \b sees a boundary
        // between it and "when"; Rust's Unicode \b would not.
        assert!(matches("complex", "éwhen x, while y, the CLI shall z."));
        assert!(matches(
            "complex",
            "While y, the CLI shallé do x whenever... when z."
        ));
    }

    #[test]
    fn dot_matches_newline() {
        assert!(matches(
            "ubiquitous",
            "The CLI\nfront end shall print\nusage."
        ));
        assert!(!matches("ubiquitous", "The CLI\nshall print usage."));
    }

    #[test]
    fn unknown_types_never_match() {
        assert!(!matches("implemented", "The CLI shall print usage."));
    }
}
