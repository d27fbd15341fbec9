#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `protobot wms` on the wire: every adapter operation driven through the
//! binary and compared, envelope for envelope and audit event for audit event,
//! with what the library answers for the same sequence on a fresh store; the
//! upstream drafting-table golden fixture replayed line for line through the
//! binary on SQLite; a dry run that writes nothing; the exit-code policy.
//!
//! Module index:
//! - `every_adapter_operation_*`: the 30 operations, rejections included, binary vs library;
//! - `drafting_table_wms_golden_replays_*`: contracts/lifecycle.md §19 through the binary;
//! - `a_dry_run_*`: the rules' answer with the audit log and the record unchanged;
//! - `a_request_cannot_*`: the trusted context comes from configuration only;
//! - `unusable_input_*` / `a_store_failure_*`: exit statuses 2 and 1.

use std::{
    collections::BTreeSet,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use jiff::Timestamp;
use protobot_controller::wms_api::wire;
use protobot_lifecycle::{AuthorizationContext, Command as Cmd, Operation, Role, State};
use protobot_stores::{
    Mode, SqliteStore, WorkStore,
    conformance::{self, cmd},
    golden::{FIXTURE, Fixture, verify_digest},
    tour,
};
use serde_json::{Value, json};

const PROJECT: &str = conformance::PROJECT;

fn protobot() -> Command {
    Command::new(env!("CARGO_BIN_EXE_protobot"))
}

/// Runs `protobot wms` with `args`, `request` on stdin.
fn wms(args: &[&str], request: &str) -> Output {
    let mut child = protobot()
        .arg("wms")
        .args(args)
        .env_remove("PROTOBOT_WMS_SUBJECT")
        .env_remove("PROTOBOT_WMS_ROLE")
        .env_remove("PROTOBOT_WMS_IDENTITY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn answer_of(out: &Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "protobot wms failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The identity file of `ctx` (every field but the project, which the store names).
fn identity_file(dir: &Path, ctx: &AuthorizationContext) -> PathBuf {
    let mut v = serde_json::to_value(ctx).unwrap();
    v.as_object_mut().unwrap().remove("project_id");
    let path = dir.join(format!("identity-{}.json", ctx.subject));
    std::fs::write(&path, v.to_string()).unwrap();
    path
}

/// A conformance context for `role` (its family, partition and preflight).
fn ctx(role: Role, now: Timestamp) -> AuthorizationContext {
    let h = conformance::Harness {
        store: std::sync::Arc::new(protobot_stores::MemoryStore::new(
            PROJECT,
            conformance::config(),
        )),
        now,
    };
    h.ctx(role)
}

async fn seeded_store(path: &Path) -> SqliteStore {
    let store = SqliteStore::open(path, PROJECT, conformance::config()).unwrap();
    tour::seed(&store).await.unwrap();
    store
}

#[tokio::test]
async fn every_adapter_operation_answers_through_the_binary_exactly_as_through_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let now = conformance::eval_time();
    let on_wire = dir.path().join("wire.sqlite");
    let in_process = dir.path().join("library.sqlite");
    drop(seeded_store(&on_wire).await);
    let library = seeded_store(&in_process).await;
    let store_arg = format!("sqlite:{}", on_wire.display());
    let now_arg = now.to_string();
    let mut covered = BTreeSet::new();
    let mut fence = protobot_lifecycle::FencingToken::default();
    let mut codes = Vec::new();
    for (i, (role, mut env)) in tour::steps().into_iter().enumerate() {
        if env.fencing_token == tour::FENCE {
            env.fencing_token = fence.clone();
        }
        let context = ctx(role, now);
        let identity = identity_file(dir.path(), &context);
        let request = serde_json::to_string(&env).unwrap();
        let out = wms(
            &[
                "--store",
                &store_arg,
                "--project",
                PROJECT,
                "--identity",
                identity.to_str().unwrap(),
                "--now",
                &now_arg,
                "--materializer-subject",
                conformance::MATERIALIZER,
            ],
            &request,
        );
        let got = answer_of(&out);
        let want = wire::operate(&library, &context, &env, now, Mode::Apply)
            .await
            .unwrap();
        assert_eq!(
            got,
            serde_json::to_value(&want).unwrap(),
            "step {i} ({}): the binary's answer differs from the library's",
            env.operation
        );
        assert_eq!(
            got["actor"]["subject"], context.subject,
            "step {i}: trusted actor"
        );
        assert_eq!(got["audit"]["count"], want.audit.events.len());
        if let Some(t) = want
            .result
            .decision
            .as_ref()
            .and_then(|d| d.fencing_token_issued.clone())
        {
            fence = t;
        }
        codes.push((
            env.operation.clone(),
            want.result.code().map(|c| c.as_str()),
            want.audit.count,
        ));
        if let Some(op) = Operation::parse(&env.operation) {
            covered.insert(op);
        }
    }
    let all: BTreeSet<Operation> = Operation::ALL.iter().copied().collect();
    assert_eq!(
        covered, all,
        "every adapter operation was driven through the binary"
    );
    // The sequence is not vacuous: it holds successes with their audit events and rejections.
    let applied: Vec<_> = codes
        .iter()
        .filter(|(_, c, n)| c.is_none() && *n == 1)
        .collect();
    let rejected: BTreeSet<&str> = codes.iter().filter_map(|(_, c, _)| *c).collect();
    assert!(applied.len() >= 8, "successful mutations: {codes:?}");
    for code in [
        "UNAUTHORIZED_ACTION",
        "DUPLICATE_REQUEST",
        "NOT_FOUND",
        "STALE_FENCING_TOKEN",
    ] {
        assert!(
            rejected.contains(code),
            "{code} among the rejections: {codes:?}"
        );
    }
    // Both stores hold the same audit log and records afterwards.
    let wire_store = SqliteStore::open(&on_wire, PROJECT, conformance::config()).unwrap();
    assert_eq!(
        wire_store.audit_events().await.unwrap(),
        library.audit_events().await.unwrap()
    );
    assert_eq!(
        wire_store.list(&Default::default()).await.unwrap(),
        library.list(&Default::default()).await.unwrap()
    );
}

#[tokio::test]
async fn store_reads_answer_what_the_library_holds_and_found_false_for_a_missing_object() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wms.sqlite");
    let store = seeded_store(&path).await;
    let store_arg = format!("sqlite:{}", path.display());
    let read = |req: Value| {
        answer_of(&wms(
            &["--store", &store_arg, "--project", PROJECT],
            &req.to_string(),
        ))
    };
    let got = read(json!({"read": "work-item", "id": "wi-ready"}));
    assert_eq!(got["found"], true);
    assert_eq!(
        got["value"],
        serde_json::to_value(store.get("wi-ready").await.unwrap()).unwrap()
    );
    let missing = read(json!({"read": "request", "id": "request-404"}));
    assert_eq!(
        (missing["found"].clone(), missing["value"].clone()),
        (json!(false), Value::Null)
    );
    assert_eq!(
        read(json!({"read": "findings", "inspection_run_id": "run-1"}))["value"],
        json!([])
    );
    assert_eq!(read(json!({"read": "audit-log"}))["value"], json!([]));
    assert_eq!(
        read(json!({"read": "submission", "id": "s-1"}))["found"],
        false
    );
}

#[tokio::test]
async fn a_dry_run_answers_what_the_rules_decide_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wms.sqlite");
    let store = seeded_store(&path).await;
    let before_record = store.get("wi-ready").await.unwrap();
    let before_audit = store.audit_events().await.unwrap();
    let store_arg = format!("sqlite:{}", path.display());
    let now = conformance::eval_time().to_string();
    let claim = serde_json::to_string(&cmd(
        Cmd::Claim,
        "wi-ready",
        State::ReadyForBuilding,
        3,
        "dry-1",
    ))
    .unwrap();
    let args = [
        "--store",
        &store_arg,
        "--project",
        PROJECT,
        "--subject",
        "job-site-a",
        "--role",
        "job-site",
        "--now",
        &now,
    ];
    let dry = answer_of(&wms(&[&args[..], &["--dry-run"]].concat(), &claim));
    assert_eq!(dry["dry_run"], true);
    assert_eq!(
        dry["result"]["outcome"], "applied",
        "the rules would allow the claim"
    );
    assert_eq!(
        dry["audit"]["count"], 1,
        "and it would append one audit event"
    );
    assert_eq!(dry["audit"]["events"][0]["subject"], "job-site-a");
    assert_eq!(
        store.get("wi-ready").await.unwrap(),
        before_record,
        "the record is unchanged"
    );
    assert_eq!(
        store.audit_events().await.unwrap(),
        before_audit,
        "the audit log is unchanged"
    );
    // The key was not consumed either: the real call is new, not a replay, and answers alike.
    let real = answer_of(&wms(&args, &claim));
    assert_eq!(real["dry_run"], false);
    assert_eq!(real["result"]["idempotency"], "new");
    assert_eq!(
        real["result"]["decision"]["after"],
        dry["result"]["decision"]["after"]
    );
    assert_eq!(
        real["result"]["decision"]["fencing_token_issued"],
        dry["result"]["decision"]["fencing_token_issued"]
    );
    assert_eq!(
        store.audit_events().await.unwrap().len(),
        before_audit.len() + 1
    );
    assert_eq!(
        store.get("wi-ready").await.unwrap().unwrap().state,
        State::Building
    );
}

#[tokio::test]
async fn a_request_cannot_carry_or_widen_its_own_authorization() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wms.sqlite");
    let store = seeded_store(&path).await;
    let store_arg = format!("sqlite:{}", path.display());
    let args = [
        "--store",
        &store_arg,
        "--project",
        PROJECT,
        "--subject",
        "agent-1",
        "--role",
        "drafting-table",
    ];
    // A context field in the body is not an envelope field: unusable input, nothing written.
    let forged = json!({"operation": "abandon", "actor_context_ref": "dt", "work_item_id": "wi-blocked",
        "expected_state": "blocked", "expected_contract_version": 6, "idempotency_key": "f-1",
        "role": "human-maintainer", "allowed_actions": ["abandon"]});
    let out = wms(&args, &forged.to_string());
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown field"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `untrusted_actor` is accepted and ignored: the configured drafting table stays one.
    let ignored = json!({"operation": "abandon", "actor_context_ref": "dt", "work_item_id": "wi-blocked",
        "expected_state": "blocked", "expected_contract_version": 6, "idempotency_key": "f-2",
        "payload": {"cancellation_confirmed": true},
        "untrusted_actor": {"subject": "human-1", "role": "human-maintainer", "allowed_actions": ["abandon"]}});
    let got = answer_of(&wms(
        &[&args[..], &["--action", "abandon"]].concat(),
        &ignored.to_string(),
    ));
    assert_eq!(got["result"]["error"]["code"], "UNAUTHORIZED_ACTION");
    assert_eq!(got["actor"]["role"], "drafting-table");
    assert_eq!(got["audit"]["count"], 0);
    assert_eq!(
        store.get("wi-blocked").await.unwrap().unwrap().state,
        State::Blocked
    );
    assert!(store.audit_events().await.unwrap().is_empty());
}

#[test]
fn unusable_input_exits_2_and_prints_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("sqlite:{}", dir.path().join("none.sqlite").display());
    let request = r#"{"operation": "request.get", "actor_context_ref": "dt", "request_id": "r"}"#;
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (
            vec![
                "--store",
                &missing,
                "--project",
                PROJECT,
                "--subject",
                "a",
                "--role",
                "drafting-table",
            ],
            request,
            "no such work store",
        ),
        (
            vec!["--store", &missing, "--project", PROJECT],
            "not json",
            "not one JSON object",
        ),
        (
            vec!["--store", &missing, "--project", PROJECT],
            "[1]",
            "not one JSON object",
        ),
        (
            vec!["--store", &missing, "--project", PROJECT],
            r#"{"read": "secret"}"#,
            "store read is invalid",
        ),
        (
            vec!["--store", "etcd:x", "--project", PROJECT],
            request,
            "names no store",
        ),
    ];
    for (args, input, says) in cases {
        let out = wms(&args, input);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn an_operation_without_an_identity_is_refused_before_the_store_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wms.sqlite");
    drop(seeded_store(&path).await);
    let store_arg = format!("sqlite:{}", path.display());
    let out = wms(
        &["--store", &store_arg, "--project", PROJECT],
        r#"{"operation": "request.get", "actor_context_ref": "dt", "request_id": "r"}"#,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no identity"));
}

#[test]
fn a_store_failure_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    // A file that is not a SQLite database: the store cannot open it.
    let path = dir.path().join("wms.sqlite");
    std::fs::write(
        &path,
        b"this is not a database, it is a text file of some length...",
    )
    .unwrap();
    let out = wms(
        &[
            "--store",
            &format!("sqlite:{}", path.display()),
            "--project",
            PROJECT,
        ],
        r#"{"read": "audit-log"}"#,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("work store failed"), "{stderr}");
    assert!(out.stdout.is_empty());
}

// === the upstream golden fixture through the binary ===

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/upstream")
}

#[tokio::test]
async fn drafting_table_wms_golden_replays_line_for_line_through_the_binary_on_sqlite() {
    let dir = fixtures_dir();
    let raw = std::fs::read(dir.join(FIXTURE)).unwrap();
    let sources = std::fs::read_to_string(dir.join("SOURCES")).unwrap();
    if let Err(e) = verify_digest(&sources, FIXTURE, &raw) {
        panic!("{e}");
    }
    let golden = Fixture::parse(&raw).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wms.sqlite");
    {
        let store = SqliteStore::open(&path, &golden.project_id, golden.adapter_config()).unwrap();
        golden.seed(&store).await.unwrap();
    }
    // The fake Gate's contexts as the callers' identity files (as written in the fixture).
    let mut identities = std::collections::BTreeMap::new();
    for (actor, c) in golden.lines[0]["fake_gate_contexts"].as_object().unwrap() {
        let file = tmp.path().join(format!("{actor}.json"));
        std::fs::write(&file, c.to_string()).unwrap();
        identities.insert(actor.clone(), file);
    }
    let store_arg = format!("sqlite:{}", path.display());
    let now = golden.now.to_string();
    let materializer = golden.adapter_config().materializer_subject;
    let mut replayed = 0;
    let mut audited = 0;
    for step in golden.steps().unwrap() {
        let (Some(env), Some(expected)) = (&step.envelope, &step.expected) else {
            continue;
        };
        let mut request = serde_json::to_value(env).unwrap();
        // Stricter than the procedure: a forged context travels on the wire and is ignored.
        if let Some(forged) = step.raw.get("untrusted_actor") {
            request["untrusted_actor"] = forged.clone();
        }
        let identity = identities[&env.actor_context_ref]
            .to_str()
            .unwrap()
            .to_string();
        let out = wms(
            &[
                "--store",
                &store_arg,
                "--project",
                &golden.project_id,
                "--identity",
                &identity,
                "--now",
                &now,
                "--materializer-subject",
                &materializer,
                "--lease-seconds",
                "900",
            ],
            &request.to_string(),
        );
        let got = answer_of(&out);
        if let Err(diffs) = protobot_stores::golden::compare(&step.step, expected, &got["result"]) {
            panic!("line {}: {}\n({got})", step.line, diffs.join("\n"));
        }
        // §17: exactly one audit event per accepted mutation, none otherwise.
        let mutated = got["result"]["mutation"] == "applied";
        assert_eq!(
            got["audit"]["count"],
            u64::from(mutated),
            "{}: audit count",
            step.step
        );
        if mutated {
            assert_eq!(
                got["audit"]["events"][0]["subject"],
                golden.contexts[&env.actor_context_ref].subject
            );
            audited += 1;
        }
        replayed += 1;
    }
    assert_eq!(
        replayed, 43,
        "every operation record with a result was replayed"
    );
    // Final state (§19 step 5), read back through the binary.
    let read = |req: Value| {
        answer_of(&wms(
            &["--store", &store_arg, "--project", &golden.project_id],
            &req.to_string(),
        ))
    };
    let request = read(json!({"read": "request", "id": "request-001"}))["value"].clone();
    assert_eq!(request["request_revision"], 6);
    assert_eq!(request["business_priority"], "urgent");
    assert_eq!(request["change_set_id"], "CS-00001");
    assert_eq!(request["build_work_item_id"], "wi-001");
    assert_eq!(
        read(json!({"read": "submission", "id": "resolution-submission-001"}))["value"]["status"],
        "superseded"
    );
    assert_eq!(
        read(json!({"read": "submission", "id": "acknowledgement-001"}))["value"]["status"],
        "consumed"
    );
    let wi = read(json!({"read": "work-item", "id": "wi-001"}))["value"].clone();
    assert_eq!(
        (wi["state"].clone(), wi["contract_version"].clone()),
        (json!("blocked"), json!(7))
    );
    let log = read(json!({"read": "audit-log"}))["value"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(
        log, audited,
        "the audit log holds exactly the events the answers reported"
    );
}
