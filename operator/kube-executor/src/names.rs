//! Deterministic Kubernetes names for runs.
//!
//! A `RunSpec::run_id` is free text (`wi-cs-00001/cycle-2/worker-a`); the pod,
//! its NetworkPolicy, its staging directory and its `protobot.dev/run-id`
//! label value all use [`run_name`], a DNS-1123 label derived from it. The
//! same id always gives the same name (so a retried run collides with a live
//! one instead of running twice), and different ids never share a name: a
//! digest of the exact id is always appended, so `A` and `a`, or two long ids
//! with the same prefix, stay apart.

use sha2::{Digest, Sha256};

/// Prefix of every run name (also keeps names from starting with a digit).
pub const NAME_PREFIX: &str = "pb-";
/// Hex digits of the id digest appended to every name.
const DIGEST_HEX: usize = 10;
/// Longest readable part kept from the id: 63 − prefix − '-' − digest.
const READABLE_MAX: usize = 63 - NAME_PREFIX.len() - 1 - DIGEST_HEX;

/// The DNS-1123 label (at most 63 characters, also a valid label value) for
/// `run_id`: `pb-<readable part>-<digest>`.
pub fn run_name(run_id: &str) -> String {
    let mut readable = String::with_capacity(run_id.len());
    for c in run_id.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if c == '-' && (readable.is_empty() || readable.ends_with('-')) {
            continue;
        }
        readable.push(c);
    }
    readable.truncate(READABLE_MAX);
    let readable = readable.trim_end_matches('-');
    let digest = hex::encode(Sha256::digest(run_id.as_bytes()));
    let digest = &digest[..DIGEST_HEX];
    if readable.is_empty() {
        format!("{NAME_PREFIX}{digest}")
    } else {
        format!("{NAME_PREFIX}{readable}-{digest}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::is_dns_label;

    #[test]
    fn names_are_dns_labels_and_deterministic() {
        let ids = [
            "wi-cs-00001/cycle-2/worker-a",
            "WI_CS 00001::Worker B",
            "",
            "----",
            "ünïcødé",
            &"x".repeat(300),
            "9starts-with-digit",
        ];
        for id in ids {
            let name = run_name(id);
            assert!(is_dns_label(&name), "{id:?} -> {name:?}");
            assert_eq!(name, run_name(id));
        }
        assert_eq!(
            run_name("wi-cs-00001/cycle-2/worker-a"),
            format!(
                "pb-wi-cs-00001-cycle-2-worker-a-{}",
                &hex::encode(Sha256::digest(b"wi-cs-00001/cycle-2/worker-a"))[..10]
            )
        );
    }

    #[test]
    fn ids_that_sanitize_alike_get_different_names() {
        assert_ne!(run_name("A"), run_name("a"));
        assert_ne!(run_name("a/b"), run_name("a-b"));
        let long = "y".repeat(100);
        assert_ne!(run_name(&format!("{long}1")), run_name(&format!("{long}2")));
    }
}
