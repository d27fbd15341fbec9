#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The Job Site end to end on the memory store with the in-process test
//! executor (scripted Workers, integration runner and Inspector): a change set to
//! one merge, crash consistency at every effect boundary, two Job Sites racing
//! over twenty change sets, a paused Job Site whose lease was recovered, and
//! escalation resumed from the persisted attempts.

use std::{
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use protobot_jobsite::{
    engine::read_trace,
    executor::SandboxRole,
    lease::{Claim, Clock, Held},
    scripted::{Behaviour, LEASE, SiteOptions, World, ids, merges_on_main, site},
    site::{JobSite, SiteAction},
    testing::{InProcessExecutor, git},
};
use protobot_lifecycle::{State, WorkItemRecord};
use protobot_stores::{AdapterConfig, MemoryStore, Observation, WorkStore};

type Site = JobSite<MemoryStore, InProcessExecutor>;

fn memory() -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(
        "demo",
        AdapterConfig {
            materializer_subject: "m".into(),
            lease_seconds: LEASE,
        },
    ))
}

async fn world(items: &[String]) -> World<MemoryStore> {
    protobot_jobsite::scripted::world(memory(), items).await
}

async fn record(w: &World<MemoryStore>, id: &str) -> WorkItemRecord {
    w.store.get(id).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_set_is_built_triaged_inspected_reworked_attested_and_merged() {
    let items = ids(1);
    let w = world(&items).await;
    let js = site(
        &w,
        SiteOptions {
            behaviour: Behaviour {
                wrong_until_cycle: 1,
                inspector_objects_once: true,
                ..Behaviour::default()
            },
            ..SiteOptions::default()
        },
    );
    let actions = js.run_until_idle().await.unwrap();
    let report = actions
        .iter()
        .find_map(|a| match a {
            SiteAction::Built { report } => Some(report.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no build in {actions:#?}"));
    assert_eq!(report.state, State::Completed, "{actions:?}");
    let decisions: Vec<&str> = report.cycles.iter().map(|c| c.decision.as_str()).collect();
    assert_eq!(
        decisions,
        ["implementation", "pass", "rejected-inspection", "pass"],
        "a real triage cycle, then an inspection rework"
    );
    // Feedback reached Worker B only through the sanitizer: no test path, no raw text.
    let rework = &report.cycles[2];
    assert!(
        rework.redactions > 0,
        "the test path and the summary were redacted"
    );
    let worker_b_feedback = serde_json::to_string(&rework.feedback).unwrap();
    assert!(!worker_b_feedback.contains("tests/"), "{worker_b_feedback}");
    assert!(
        !worker_b_feedback.contains("assertion"),
        "{worker_b_feedback}"
    );
    // Inspection: the first run sent it back, the second sealed.
    assert_eq!(report.inspections.len(), 2);
    assert!(matches!(
        report.inspections[0].verdict,
        protobot_jobsite::inspection::Verdict::Rework { .. }
    ));
    assert!(matches!(
        report.inspections[1].verdict,
        protobot_jobsite::inspection::Verdict::Sealed { .. }
    ));
    // One merge, with the trailer, containing the attestation snapshot.
    assert_eq!(merges_on_main(&w.origin), items);
    let merge = report.merge_commit.clone().unwrap();
    let files = git(&w.origin, &["ls-tree", "-r", "--name-only", &merge]);
    assert!(
        files.contains(".protobot/attestations/wi-01/findings.jsonl"),
        "{files}"
    );
    assert!(files.contains("src/wi-01.sh") && files.contains("tests/wi-01.sh"));
    let findings = git(
        &w.origin,
        &[
            "show",
            &format!("{merge}:.protobot/attestations/wi-01/findings.jsonl"),
        ],
    );
    assert!(
        findings.contains(r#""state":"resolved""#),
        "the routed finding was resolved: {findings}"
    );
    // The store: completed, no lease, attempts persisted with their tiers.
    let rec = record(&w, "wi-01").await;
    assert_eq!(rec.state, State::Completed);
    assert_eq!(rec.lease, None, "no orphaned lease");
    let outcomes: Vec<&str> = rec.attempts.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(
        outcomes,
        ["implementation", "passed", "rejected-inspection", "passed"]
    );
    assert_eq!(
        rec.attempts
            .iter()
            .map(|a| a.tier.as_str())
            .collect::<Vec<_>>(),
        ["t1", "t1", "t1", "t2"],
        "two genuine failures move t1 → t2"
    );
    // Every stage left a structured trace event.
    let trace = read_trace(&js.engine.config.scratch, "wi-01");
    for stage in [
        "cycle",
        "gate",
        "revalidation",
        "inspection",
        "land",
        "command",
    ] {
        assert!(
            trace.iter().any(|e| e.stage == stage),
            "no {stage} trace event in {trace:?}"
        );
    }
}

/// Every boundary name of one clean build, in order.
async fn boundaries_of_a_clean_build() -> Vec<String> {
    let items = ids(1);
    let w = world(&items).await;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let js = site(
        &w,
        SiteOptions {
            behaviour: Behaviour {
                wrong_until_cycle: 1,
                ..Behaviour::default()
            },
            faults: Some(Arc::new(move |b: &str| {
                log.lock().unwrap().push(b.to_string());
                false
            })),
            ..SiteOptions::default()
        },
    );
    js.run_until_idle().await.unwrap();
    assert_eq!(record(&w, "wi-01").await.state, State::Completed);
    seen.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_every_effect_boundary_then_a_restart_completes_exactly_once() {
    let boundaries = boundaries_of_a_clean_build().await;
    for expected in [
        "after:claim",
        "after:import-worker-a-1",
        "after:attempt-1",
        "after:tests-pass",
        "after:observe-inspection",
        "after:attestation",
        "after:begin-merge",
        "before:land",
        "after:land",
        "after:record-merge",
    ] {
        assert!(
            boundaries.iter().any(|b| b == expected),
            "{expected} missing from {boundaries:?}"
        );
    }
    for (k, boundary) in boundaries.iter().enumerate() {
        // Even: the same Job Site restarts and adopts its live lease. Odd: it never
        // comes back; the lease expires and another Job Site recovers the item.
        let same_site = k % 2 == 0;
        let items = ids(1);
        let w = world(&items).await;
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let crashing = site(
            &w,
            SiteOptions {
                behaviour: Behaviour {
                    wrong_until_cycle: 1,
                    ..Behaviour::default()
                },
                faults: Some(Arc::new(move |_b: &str| {
                    counter.fetch_add(1, Ordering::SeqCst) == k
                })),
                ..SiteOptions::default()
            },
        );
        let first = crashing.run_once().await.unwrap();
        assert!(
            first.iter().any(
                |a| matches!(a, SiteAction::Failed { error, .. } if error.contains("interrupted"))
            ),
            "boundary {k} ({boundary}) did not interrupt: {first:?}"
        );
        let home = crashing.repo_dir.parent().map(Path::to_path_buf);
        drop(crashing);
        let restarted = if same_site {
            site(
                &w,
                SiteOptions {
                    behaviour: Behaviour {
                        wrong_until_cycle: 1,
                        ..Behaviour::default()
                    },
                    home,
                    ..SiteOptions::default()
                },
            )
        } else {
            w.clock.advance(LEASE + 1);
            site(
                &w,
                SiteOptions {
                    subject: "js-2",
                    behaviour: Behaviour {
                        wrong_until_cycle: 1,
                        ..Behaviour::default()
                    },
                    ..SiteOptions::default()
                },
            )
        };
        let actions = restarted.run_until_idle().await.unwrap();
        let rec = record(&w, "wi-01").await;
        assert_eq!(
            rec.state,
            State::Completed,
            "crash at {boundary} (#{k}, same site {same_site}): {actions:?}"
        );
        assert_eq!(
            merges_on_main(&w.origin),
            items,
            "exactly one merge after a crash at {boundary}"
        );
        assert_eq!(
            rec.lease, None,
            "no orphaned lease after a crash at {boundary}"
        );
        assert_eq!(
            w.store.list(&Default::default()).await.unwrap().len(),
            1,
            "no duplicate work item"
        );
        let head_trailer = git(
            &w.origin,
            &[
                "log",
                "-1",
                "--format=%(trailers:key=Work-Item,valueonly)",
                "main",
            ],
        );
        assert_eq!(
            head_trailer.trim(),
            "wi-01",
            "main ends with the item's merge"
        );
    }
}

#[test]
fn two_job_sites_racing_over_twenty_change_sets_claim_and_merge_each_once() {
    let items = ids(20);
    let w = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(world(&items));
    let sites: Vec<Arc<Site>> = ["js-1", "js-2"]
        .into_iter()
        .map(|subject| {
            Arc::new(site(
                &w,
                SiteOptions {
                    subject,
                    inspector: false,
                    ..SiteOptions::default()
                },
            ))
        })
        .collect();
    let store = w.store.clone();
    let threads: Vec<_> = sites
        .into_iter()
        .map(|s| {
            let store = store.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let mut built = 0;
                    for _ in 0..200 {
                        let actions = s.run_once().await.unwrap();
                        for a in &actions {
                            if let SiteAction::Failed { error, .. } = a {
                                panic!("a build failed: {error}");
                            }
                            if let SiteAction::Built { report } = a
                                && report.state == State::Completed
                            {
                                built += 1;
                            }
                        }
                        let all = store.list(&Default::default()).await.unwrap();
                        if all.iter().all(|r| r.state == State::Completed) {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    built
                })
            })
        })
        .collect();
    let built: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(
        built.iter().sum::<usize>(),
        20,
        "each item completed once: {built:?}"
    );
    assert_eq!(
        merges_on_main(&w.origin),
        items,
        "each item merged exactly once"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let audit = rt.block_on(w.store.audit_events()).unwrap();
    for id in &items {
        let claims = audit
            .iter()
            .filter(|e| e.operation == "claim" && &e.work_item_id == id && e.outcome == "allowed")
            .count();
        assert_eq!(claims, 1, "{id} claimed {claims} times");
    }
    // Every merged tree holds every item's code: nothing was lost in the races.
    let files = git(&w.origin, &["ls-tree", "-r", "--name-only", "main"]);
    for id in &items {
        assert!(files.contains(&format!("src/{id}.sh")), "{id} lost");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_job_site_whose_lease_was_recovered_has_every_write_rejected() {
    let items = ids(1);
    let w = world(&items).await;
    // js-1 stops (as if paused) right after tests-pass.
    let paused = site(
        &w,
        SiteOptions {
            faults: Some(Arc::new(|b: &str| b == "after:tests-pass")),
            ..SiteOptions::default()
        },
    );
    paused.run_once().await.unwrap();
    let rec = record(&w, "wi-01").await;
    assert_eq!(rec.state, State::Inspecting);
    let lease = rec.lease.clone().unwrap();
    let stale = Claim::new(Held {
        work_item_id: "wi-01".into(),
        fencing_token: lease.fencing_token.clone(),
        state: rec.state,
        contract_version: rec.contract_version,
    });
    // The lease expires; js-2 recovers the item and completes it.
    w.clock.advance(LEASE + 1);
    let other = site(
        &w,
        SiteOptions {
            subject: "js-2",
            ..SiteOptions::default()
        },
    );
    let actions = other.run_until_idle().await.unwrap();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, SiteAction::RecoveredLease { .. }))
    );
    assert_eq!(record(&w, "wi-01").await.state, State::Completed);
    let audits_before = w.store.audit_events().await.unwrap().len();
    let attempts_before = record(&w, "wi-01").await.attempts;
    // js-1 wakes up with its old claim: every write is refused.
    let resumed = paused
        .engine
        .build(&stale, &w.contracts.0["wi-01"], &paused.repo_dir)
        .await;
    assert!(resumed.is_err(), "the stale engine must stop: {resumed:?}");
    let renew = protobot_jobsite::lease::renew_once(
        w.store.as_ref(),
        &paused.engine.context,
        &stale,
        &w.clock,
    )
    .await;
    assert!(renew.is_err());
    let observed = w
        .store
        .observe(
            "wi-01",
            Observation::Attempt {
                fencing_token: lease.fencing_token,
                attempt: attempts_before[0].clone(),
            },
        )
        .await;
    assert!(observed.is_err(), "a stale fence cannot record an attempt");
    let after = record(&w, "wi-01").await;
    assert_eq!(after.attempts, attempts_before);
    let audits: Vec<_> = w.store.audit_events().await.unwrap();
    assert!(
        audits[audits_before..]
            .iter()
            .all(|e| e.outcome != "allowed"),
        "no write of the stale Job Site was accepted: {:?}",
        &audits[audits_before..]
    );
    assert_eq!(merges_on_main(&w.origin), items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_ignores_transient_failures_and_a_restart_resumes_at_the_persisted_tier() {
    let items = ids(1);
    let w = world(&items).await;
    // Worker B is wrong for three cycles; its very first run is an executor failure.
    // js-1 crashes right after recording cycle 2.
    let behaviour = Behaviour {
        wrong_until_cycle: 3,
        transient_first: true,
        ..Behaviour::default()
    };
    let first = site(
        &w,
        SiteOptions {
            behaviour: behaviour.clone(),
            faults: Some(Arc::new(|b: &str| b == "after:attempt-2")),
            max_cycles: 6,
            ..SiteOptions::default()
        },
    );
    let mut actions = Vec::new();
    for _ in 0..4 {
        actions.extend(first.run_once().await.unwrap());
        if actions
            .iter()
            .any(|a| matches!(a, SiteAction::Failed { error, .. } if error.contains("interrupted")))
        {
            break;
        }
    }
    let rec = record(&w, "wi-01").await;
    let so_far: Vec<(&str, &str)> = rec
        .attempts
        .iter()
        .map(|a| (a.outcome.as_str(), a.tier.as_str()))
        .collect();
    // The transient attempt of cycle 1 was replaced by its retry at the same tier.
    assert_eq!(
        so_far,
        [("implementation", "t1"), ("implementation", "t1")],
        "{actions:?}"
    );
    drop(first);
    let restarted = site(
        &w,
        SiteOptions {
            behaviour,
            max_cycles: 6,
            ..SiteOptions::default()
        },
    );
    restarted.run_until_idle().await.unwrap();
    let rec = record(&w, "wi-01").await;
    assert_eq!(rec.state, State::Completed);
    let tiers: Vec<&str> = rec.attempts.iter().map(|a| a.tier.as_str()).collect();
    assert_eq!(tiers, ["t1", "t1", "t2", "t3"], "the restart resumed at t2");
    let runs = restarted.engine.executor.runs();
    let first_b = runs
        .iter()
        .find(|r| r.role == SandboxRole::WorkerB)
        .expect("worker B ran after the restart");
    assert_eq!(first_b.task["cycle"], 3);
    assert_eq!(first_b.task["model_tier"], "t2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_site_whose_executor_refuses_claims_nothing() {
    let items = ids(2);
    let w = world(&items).await;
    let mut js = site(&w, SiteOptions::default());
    let engine = Arc::get_mut(&mut js.engine).unwrap();
    let runs = w.root.join("refusing-runs");
    engine.executor = Arc::new(
        protobot_jobsite::scripted::executor(&runs, Behaviour::default())
            .refusing("no conformance report"),
    );
    let actions = js.run_until_idle().await.unwrap();
    assert!(actions.is_empty(), "{actions:?}");
    for id in &items {
        let rec = record(&w, id).await;
        assert_eq!(
            rec.state,
            State::ReadyForBuilding,
            "{id} must stay claimable"
        );
        assert_eq!(rec.lease, None);
    }
    assert!(js.engine.executor.runs().is_empty(), "no role ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_item_is_built_after_its_dependency_merges_and_blocked_if_it_is_abandoned() {
    use protobot_lifecycle::Dependency;
    use protobot_stores::Import;
    let items = ids(4);
    let w = world(&items).await;
    // wi-02 waits for wi-01; wi-03 waits for wi-04, which a person abandons.
    for (id, dep) in [("wi-02", "wi-01"), ("wi-03", "wi-04")] {
        let mut rec = record(&w, id).await;
        rec.state = State::Waiting;
        rec.dependencies = vec![Dependency {
            id: dep.into(),
            state: State::ReadyForBuilding,
        }];
        w.store.import(Import::Record(rec)).await.unwrap();
    }
    let mut abandoned = record(&w, "wi-04").await;
    abandoned.state = State::Abandoned;
    w.store.import(Import::Record(abandoned)).await.unwrap();
    let js = site(
        &w,
        SiteOptions {
            inspector: false,
            ..SiteOptions::default()
        },
    );
    let actions = js.run_until_idle().await.unwrap();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, SiteAction::DependenciesRefreshed { work_item_id } if work_item_id == "wi-02")),
        "{actions:?}"
    );
    assert_eq!(record(&w, "wi-01").await.state, State::Completed);
    assert_eq!(record(&w, "wi-02").await.state, State::Completed);
    // The dependency merged first.
    let order = git(
        &w.origin,
        &[
            "log",
            "--first-parent",
            "--merges",
            "--reverse",
            "--format=%(trailers:key=Work-Item,valueonly)",
            "main",
        ],
    );
    let order: Vec<&str> = order
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(order, ["wi-01", "wi-02"]);
    let blocked = record(&w, "wi-03").await;
    assert_eq!(blocked.state, State::Blocked);
    assert!(
        blocked.block_reason.contains("wi-04"),
        "{}",
        blocked.block_reason
    );
    assert_eq!(merges_on_main(&w.origin), ["wi-01", "wi-02"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_surviving_mutant_sends_the_candidate_back_to_the_test_worker() {
    let items = ids(1);
    let w = world(&items).await;
    let js = site(
        &w,
        SiteOptions {
            mutation: true,
            behaviour: Behaviour {
                mutant_survives_once: true,
                ..Behaviour::default()
            },
            ..SiteOptions::default()
        },
    );
    let actions = js.run_until_idle().await.unwrap();
    let report = actions
        .iter()
        .find_map(|a| match a {
            SiteAction::Built { report } => Some(report.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no build in {actions:#?}"));
    assert_eq!(report.state, State::Completed);
    // Both producers ran through the executor, in every inspection run.
    let runs = js.engine.executor.runs();
    assert!(runs.iter().any(|r| r.role == SandboxRole::MutationRunner));
    // Every session carries the item, its cycle and its own trace for the audit chain.
    for run in &runs {
        assert_eq!(run.audit.work_item, report.work_item_id, "{}", run.run_id);
        assert_eq!(run.audit.trace_id, run.run_id);
        let build_cycle = !run.run_id.contains("-ir-");
        assert_eq!(run.audit.cycle > 0, build_cycle, "{}", run.run_id);
        // And what its model usage is attributed to (issue 34): project, stage, tier.
        let a = &run.attribution;
        assert_eq!(a.project, js.engine.context.project_id, "{}", run.run_id);
        assert_eq!(a.stage, Some(run.role.stage()), "{}", run.run_id);
        let worker = matches!(run.role, SandboxRole::WorkerA | SandboxRole::WorkerB);
        assert_eq!(a.tier.is_some(), worker, "{}", run.run_id);
    }
    assert!(
        runs.iter()
            .any(|r| r.attribution.stage == Some(protobot_usage::Stage::Inspection))
    );
    assert!(
        runs.iter()
            .any(|r| r.attribution.tier == Some(protobot_jobsite::escalation::Tier::T1))
    );
    assert_eq!(report.inspections.len(), 2);
    assert_eq!(
        report.inspections[0].producers,
        ["inspector-1", "mutation-1"]
    );
    // The survivor became a test-gap finding routed to Worker A only.
    let rework = report
        .cycles
        .iter()
        .find(|c| c.decision == "rejected-inspection")
        .expect("an inspection rework");
    let recipients: Vec<String> = rework
        .feedback
        .iter()
        .map(|f| {
            serde_json::to_value(f.recipient)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(recipients, ["worker-a"]);
    let text = serde_json::to_string(&rework.feedback).unwrap();
    assert!(
        !text.contains("src/"),
        "no implementation path reaches Worker A: {text}"
    );
    assert!(
        !text.contains("hell`"),
        "no mutant text reaches Worker A: {text}"
    );
    assert!(matches!(
        report.inspections[1].verdict,
        protobot_jobsite::inspection::Verdict::Sealed { .. }
    ));
    assert_eq!(merges_on_main(&w.origin), items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_counts_other_job_sites_against_the_wip_limit_and_prefers_old_unrelated_work() {
    let items = ids(4);
    let w = world(&items).await;
    // Declared scopes: wi-02 shares a scope with wi-01, the others do not.
    let mut known = w.contracts.0.clone();
    for (id, scopes) in [
        ("wi-01", vec!["interface:sync-cli"]),
        ("wi-02", vec!["interface:sync-cli"]),
        ("wi-03", vec!["interface:report"]),
        ("wi-04", vec!["requirement:REQ-OTHER-001"]),
    ] {
        known.get_mut(id).unwrap().scopes = scopes.into_iter().map(String::from).collect();
    }
    // Ready since: wi-04 first, then wi-02, then wi-03 (all `normal`; wi-01 is `high`).
    let base = w.clock.now();
    for (id, minutes) in [("wi-04", -30), ("wi-02", -20), ("wi-03", -10)] {
        let mut rec = record(&w, id).await;
        rec.state_since = Some(base + jiff::SignedDuration::from_mins(minutes));
        w.store
            .import(protobot_stores::Import::Record(rec))
            .await
            .unwrap();
    }
    // Another Job Site claims the high-priority wi-01 and stops right there.
    let other = site(
        &w,
        SiteOptions {
            subject: "js-other",
            faults: Some(Arc::new(|b: &str| b == "after:claim")),
            ..SiteOptions::default()
        },
    );
    other.run_once().await.unwrap();
    let held = record(&w, "wi-01").await;
    assert_eq!(held.state, State::Building);
    assert_eq!(held.owner, "js-other");

    // The project's WIP limit is 1 and wi-01 fills it: nothing is claimed.
    let mut js = site(&w, SiteOptions::default());
    js.contracts = Arc::new(protobot_jobsite::site::KnownContracts(known));
    let actions = js.run_once().await.unwrap();
    assert!(actions.is_empty(), "{actions:?}");
    for id in ["wi-02", "wi-03", "wi-04"] {
        assert_eq!(record(&w, id).await.state, State::ReadyForBuilding, "{id}");
    }

    // With room for two more, the oldest unrelated items go first: wi-04 then
    // wi-03; wi-02 (older than wi-03 but sharing wi-01's scope) waits.
    js.wip_limit = 3;
    let actions = js.run_once().await.unwrap();
    let built: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            SiteAction::Built { report } => Some(report.work_item_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(built, ["wi-04", "wi-03"], "{actions:?}");
    assert_eq!(record(&w, "wi-02").await.state, State::ReadyForBuilding);
    assert_eq!(record(&w, "wi-04").await.state, State::Completed);
    let since = record(&w, "wi-04").await.state_since;
    assert!(
        since.is_some_and(|t| t >= base),
        "the evaluator stamps each transition with the trusted clock: {since:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_item_branch_that_conflicts_with_the_default_branch_blocks_with_a_spec_question() {
    let items = ids(1);
    let id = &items[0];
    let w = world(&items).await;
    let home = w.root.join("js-conflict");
    let first = site(
        &w,
        SiteOptions {
            inspector: false,
            faults: Some(Arc::new(|b: &str| b == "after:tests-pass")),
            home: Some(home.clone()),
            ..SiteOptions::default()
        },
    );
    first.run_once().await.unwrap();
    assert_eq!(record(&w, id).await.state, State::Inspecting);
    // Meanwhile another implementation of the same file lands on the default branch.
    let other = w.root.join("other");
    git(
        &w.root,
        &[
            "clone",
            "-q",
            w.origin.to_str().unwrap(),
            other.to_str().unwrap(),
        ],
    );
    std::fs::create_dir_all(other.join("src")).unwrap();
    std::fs::write(other.join("src").join(format!("{id}.sh")), "echo bonjour\n").unwrap();
    git(&other, &["add", "-A"]);
    git(
        &other,
        &[
            "-c",
            "user.name=maintainer",
            "-c",
            "user.email=m@example.invalid",
            "commit",
            "-qm",
            "another implementation",
        ],
    );
    git(&other, &["push", "-q", "origin", "main"]);
    // The Job Site resumes the item: merging the default branch in conflicts, which a
    // person must resolve, so the item blocks with a spec question naming the branch.
    let resumed = site(
        &w,
        SiteOptions {
            inspector: false,
            home: Some(home),
            ..SiteOptions::default()
        },
    );
    let actions = resumed.run_once().await.unwrap();
    let blocked = record(&w, id).await;
    assert_eq!(blocked.state, State::Blocked, "{actions:?}");
    assert!(
        blocked.block_reason.contains("conflicts with main"),
        "{}",
        blocked.block_reason
    );
    assert!(merges_on_main(&w.origin).is_empty());
}
