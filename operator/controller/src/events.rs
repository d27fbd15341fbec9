//! Kubernetes Events within the API server's limits. An `events.k8s.io/v1` Event's `note`
//! may hold at most 1,024 bytes (and `reason`/`action` 128); the server refuses the whole
//! Event otherwise, so a long block reason or condition message would leave no Event at
//! all. Every Event this crate publishes goes through [`bounded`].

use kube::runtime::events::Event;

/// The API server's limit on an Event's note, in bytes.
pub const NOTE_LIMIT: usize = 1024;
/// The API server's limit on an Event's reason and action, in bytes.
pub const REASON_LIMIT: usize = 128;

/// `text` cut to at most `limit` bytes on a character boundary, with `…` when cut (pure).
pub fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    const ELLIPSIS: &str = "…";
    let mut end = limit.saturating_sub(ELLIPSIS.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ELLIPSIS}", &text[..end])
}

/// `event` with its note, reason and action within the server's limits (pure).
pub fn bounded(event: &Event) -> Event {
    Event {
        type_: event.type_,
        reason: truncate(&event.reason, REASON_LIMIT),
        note: event.note.as_deref().map(|n| truncate(n, NOTE_LIMIT)),
        action: truncate(&event.action, REASON_LIMIT),
        secondary: event.secondary.clone(),
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::events::EventType;

    use super::*;

    #[test]
    fn long_notes_are_cut_on_a_character_boundary_within_the_limit() {
        let long = "é".repeat(2000); // 4,000 bytes
        let cut = truncate(&long, NOTE_LIMIT);
        assert!(cut.len() <= NOTE_LIMIT, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short", NOTE_LIMIT), "short");
        let exact = "a".repeat(NOTE_LIMIT);
        assert_eq!(truncate(&exact, NOTE_LIMIT), exact);
        for limit in 0..8 {
            assert!(truncate("ééé", limit).len() <= limit.max("…".len()));
        }
        let event = Event {
            type_: EventType::Warning,
            reason: "R".repeat(300),
            note: Some("x".repeat(5000)),
            action: "A".into(),
            secondary: None,
        };
        let b = bounded(&event);
        assert!(b.note.unwrap().len() <= NOTE_LIMIT);
        assert!(b.reason.len() <= REASON_LIMIT);
    }
}
