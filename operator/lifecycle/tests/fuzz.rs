//! Issue #16 fuzz target: the evaluator's JSON input (`rules evaluate`). Mutated documents
//! get a result or a field error, never a panic (`make fuzz` for long runs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use protobot_lifecycle::inspect::evaluate_document;
use serde_json::{Value, json};

#[path = "../../../tests/support/fuzz.rs"]
mod fuzz_support;
use fuzz_support::fuzz;

fn base() -> Value {
    let readiness = serde_json::to_value(protobot_lifecycle::Readiness::complete()).unwrap();
    json!({
        "record": {"id": "wi-1", "project_id": "p", "state": "ready-for-building", "contract_version": 4,
                   "readiness": readiness},
        "operation": {"operation": "claim", "actor_context_ref": "js", "work_item_id": "wi-1",
                      "expected_state": "ready-for-building", "expected_contract_version": 4,
                      "idempotency_key": "k1"},
        "context": {"subject": "job-site-a", "role": "job-site", "project_id": "p",
                    "allowed_actions": ["claim"], "allowed_refs": ["project:p"],
                    "expires_at": "2026-09-19T12:00:00Z", "policy_version": "wms-policy/v1"},
        "now": "2026-09-18T12:00:00Z",
    })
}

/// Hostile leaf values: extreme numbers, odd timestamps, wrong types.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(1.5e308)),
        Just(json!(null)),
        Just(json!([])),
        Just(json!({})),
        Just(json!("2026-12-31T23:59:60Z")),
        Just(json!("9999-12-31T23:59:59Z")),
        Just(json!("-009999-01-01T00:00:00Z")),
        Just(json!("building")),
        Just(json!("initial")),
        any::<i64>().prop_map(|n| json!(n)),
        ".{0,12}".prop_map(|s| json!(s)),
    ]
}

const KEYS: &[&str] = &[
    "record",
    "operation",
    "context",
    "now",
    "idempotency",
    "lease_seconds",
    "next_fencing_token",
    "dependency_states",
    "contract_version",
    "expected_contract_version",
    "state",
    "lease",
    "expires_at",
    "operation",
    "expected_state",
    "readiness",
    "allowed_actions",
    "approval",
    "submission",
    "reservation",
    "planned_dependency_state",
    "observed_readiness",
];

fn set_path(doc: &mut Value, path: &[usize], key: &str, value: Value) {
    // Resolve the steps to a JSON pointer on a shared borrow, then edit through it.
    let mut pointer = String::new();
    let mut cur: &Value = doc;
    for step in path {
        let next = match cur {
            Value::Object(m) if !m.is_empty() => m
                .iter()
                .nth(step % m.len())
                .map(|(k, v)| (k.replace('~', "~0").replace('/', "~1"), v)),
            Value::Array(a) if !a.is_empty() => {
                let i = step % a.len();
                a.get(i).map(|v| (i.to_string(), v))
            }
            _ => None,
        };
        match next {
            Some((segment, v)) => {
                pointer.push('/');
                pointer.push_str(&segment);
                cur = v;
            }
            None => break,
        }
    }
    match doc.pointer_mut(&pointer) {
        Some(Value::Object(m)) => {
            m.insert(key.to_owned(), value);
        }
        Some(other) => *other = value,
        None => {}
    }
}

#[test]
fn fuzz_evaluator_json_input() {
    let edits = prop::collection::vec(
        (
            prop::collection::vec(any::<usize>(), 0..3),
            prop::sample::select(KEYS.to_vec()),
            leaf(),
        ),
        0..5,
    );
    assert_eq!(
        evaluate_document(&base().to_string()).unwrap()["result"]["ok"],
        true,
        "the seed document is a valid claim"
    );
    fuzz(
        "evaluator_json_input",
        (edits, any::<u8>(), ".{0,8}"),
        |(edits, cut, junk)| {
            let mut doc = base();
            for (path, key, value) in edits {
                set_path(&mut doc, &path, key, value);
            }
            let text = doc.to_string();
            let _ = evaluate_document(&text);
            // Truncated, duplicated-key and junk-suffixed forms of the same document.
            let at = (text.len() * usize::from(cut)) / 256;
            let _ = evaluate_document(text.get(..at).unwrap_or(""));
            let _ = evaluate_document(&text.replacen('{', "{\"now\": 1, ", 1));
            let _ = evaluate_document(&format!("{text}{junk}"));
        },
    );
}
