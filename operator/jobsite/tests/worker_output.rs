#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Issue #16, "wedged items": refused or failing Worker output ends the cycle with a
//! sanitized reason to that Worker, counts against the retry budget, and the build moves on
//! (it never stops with the item `building` and its lease held).

use std::sync::Arc;

use protobot_jobsite::{
    executor::SandboxRole,
    scripted::{Behaviour, LEASE, SiteOptions, executor, ids, merges_on_main, site},
    site::SiteAction,
    testing::{Script, ScriptRun, copy_tree, git},
};
use protobot_lifecycle::State;
use protobot_stores::{AdapterConfig, MemoryStore, WorkStore};

fn cycle_of(run: &ScriptRun<'_>) -> u64 {
    run.spec.task["cycle"].as_u64().unwrap_or(1)
}

/// Worker B's honest work: the implementation, committed and handed back.
fn honest(run: &ScriptRun<'_>) -> Result<i32, String> {
    let id = run.spec.task["work_item_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let path = run.workspace.join("src").join(format!("{id}.sh"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "echo hello\n").unwrap();
    git(run.workspace, &["add", "-A"]);
    git(
        run.workspace,
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@x.invalid",
            "commit",
            "-qm",
            "Work-Ite\u{20ac}: caf\u{e9}",
        ],
    );
    copy_tree(run.workspace, &run.out.join("worker")).map_err(|e| e.to_string())?;
    Ok(0)
}

/// Each hostile output Worker B may return on its first cycle.
fn hostile_outputs() -> Vec<(&'static str, Script)> {
    vec![
        (
            "a .git file pointing elsewhere",
            Arc::new(|run: &ScriptRun<'_>| {
                if cycle_of(run) > 1 {
                    return honest(run);
                }
                let out = run.out.join("worker");
                std::fs::create_dir_all(&out).unwrap();
                std::fs::write(out.join(".git"), "gitdir: /etc\n").unwrap();
                Ok(0)
            }),
        ),
        (
            "an orphan root",
            Arc::new(|run: &ScriptRun<'_>| {
                if cycle_of(run) > 1 {
                    return honest(run);
                }
                let ws = run.workspace;
                git(ws, &["checkout", "-q", "--orphan", "rewritten"]);
                git(
                    ws,
                    &[
                        "-c",
                        "user.name=b",
                        "-c",
                        "user.email=b@x.invalid",
                        "commit",
                        "-qm",
                        "orphan",
                        "--allow-empty",
                    ],
                );
                copy_tree(ws, &run.out.join("worker")).map_err(|e| e.to_string())?;
                Ok(0)
            }),
        ),
        (
            "alternates",
            Arc::new(|run: &ScriptRun<'_>| {
                if cycle_of(run) > 1 {
                    return honest(run);
                }
                honest(run)?;
                let alt = run.out.join("worker/.git/objects/info/alternates");
                std::fs::create_dir_all(alt.parent().unwrap()).unwrap();
                std::fs::write(alt, "/nonexistent/objects\n").unwrap();
                Ok(0)
            }),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_worker_output_is_fed_back_counted_and_the_build_moves_on() {
    for (name, script) in hostile_outputs() {
        let items = ids(1);
        let store = Arc::new(MemoryStore::new(
            "demo",
            AdapterConfig {
                materializer_subject: "m".into(),
                lease_seconds: LEASE,
            },
        ));
        let w = protobot_jobsite::scripted::world(store, &items).await;
        let mut js = site(&w, SiteOptions::default());
        let engine = Arc::get_mut(&mut js.engine).unwrap();
        let runs = w.root.join(format!("runs-{}", name.len()));
        engine.executor =
            Arc::new(executor(&runs, Behaviour::default()).with(SandboxRole::WorkerB, script));
        let actions = js.run_until_idle().await.unwrap();
        let report = actions
            .iter()
            .find_map(|a| match a {
                SiteAction::Built { report } => Some(report.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{name}: no build in {actions:#?}"));
        assert_eq!(report.state, State::Completed, "{name}: {actions:?}");
        let first = &report.cycles[0];
        assert_ne!(first.decision, "pass", "{name}: the refused cycle passed");
        let feedback = serde_json::to_string(&first.feedback).unwrap();
        assert!(
            feedback.contains("could not be imported"),
            "{name}: {feedback}"
        );
        assert!(
            !feedback.contains("/etc"),
            "{name}: unsanitized: {feedback}"
        );
        assert_eq!(merges_on_main(&w.origin), items, "{name}");
        let record = w.store.get(&items[0]).await.unwrap().unwrap();
        assert_eq!(record.state, State::Completed, "{name}");
    }
}
