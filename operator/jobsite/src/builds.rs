//! The builds a process runs, each in a task of its own.
//!
//! A dispatch ([`crate::site::JobSite::dispatch`]) claims or resumes items and hands
//! each build to [`Builds::start`]; it returns at once, so a slow build holds up
//! neither its project's next dispatch nor any other project. [`Builds`] knows which
//! items are building here (a dispatch never resumes one twice), backs off an item
//! whose build stopped with an error (1 s doubling to 5 min, per item, cleared by a
//! build that got through), leaves an item alone for [`SETTLE`] after any build (a
//! dispatch reading a watch cache that lags by a moment must not resume an item that
//! just finished), reports every finished build on its channel, and lets a stopping
//! process wait until none is left.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, watch};

use crate::site::SiteAction;

/// One build that finished: what it did, and the tag of the dispatcher that started it
/// (the project's key, say).
#[derive(Debug)]
pub struct Finished {
    /// The tag given to [`Builds::start`].
    pub tag: String,
    /// The item.
    pub work_item_id: String,
    /// What the build did (`Built`, `Failed`, `MergeUnverified`).
    pub action: SiteAction,
}

/// Longest wait before an item whose builds keep stopping with an error is resumed.
pub const MAX_ITEM_BACKOFF: Duration = Duration::from_secs(300);
/// How long an item is left alone after a build of it that got through.
pub const SETTLE: Duration = Duration::from_secs(5);

type Key = (String, String);

/// Which builds run, and which items wait after a failed build.
#[derive(Debug, Default)]
struct State {
    running: BTreeSet<Key>,
    /// Failed builds in a row, and not before when the item may be resumed.
    backoff: BTreeMap<Key, (u32, Instant)>,
}

/// The wait after `failures` failed builds in a row: 1 s, 2 s, 4 s … at most
/// [`MAX_ITEM_BACKOFF`] (pure).
pub fn item_backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.clamp(1, 10).saturating_sub(1)).min(MAX_ITEM_BACKOFF)
}

/// The builds running in this process. Cheap to clone; clones share the set.
#[derive(Clone, Debug)]
pub struct Builds {
    state: watch::Sender<State>,
    finished: mpsc::UnboundedSender<Finished>,
}

impl Builds {
    /// A new set, and the receiver of its finished builds.
    pub fn new() -> (Builds, mpsc::UnboundedReceiver<Finished>) {
        let (finished, rx) = mpsc::unbounded_channel();
        let (state, _) = watch::channel(State::default());
        (Builds { state, finished }, rx)
    }

    /// Whether `work_item_id` of `tag` is building here.
    pub fn is_running(&self, tag: &str, work_item_id: &str) -> bool {
        self.state
            .borrow()
            .running
            .contains(&(tag.to_owned(), work_item_id.to_owned()))
    }

    /// Whether a dispatch must leave `work_item_id` of `tag` alone at `now`: it is
    /// building here, or its last build stopped with an error and its backoff runs.
    pub fn is_busy(&self, tag: &str, work_item_id: &str, now: Instant) -> bool {
        let key = (tag.to_owned(), work_item_id.to_owned());
        let state = self.state.borrow();
        state.running.contains(&key) || state.backoff.get(&key).is_some_and(|(_, t)| now < *t)
    }

    /// How many builds are running.
    pub fn len(&self) -> usize {
        self.state.borrow().running.len()
    }

    /// Whether no build is running.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts `build` of `work_item_id` in a task of its own; `false` (and nothing
    /// started) when that item is already building here.
    pub fn start<F>(&self, tag: &str, work_item_id: &str, build: F) -> bool
    where
        F: Future<Output = SiteAction> + Send + 'static,
    {
        let key = (tag.to_owned(), work_item_id.to_owned());
        let mut fresh = false;
        self.state.send_modify(|state| {
            fresh = state.running.insert(key.clone());
        });
        if !fresh {
            return false;
        }
        let this = self.clone();
        tokio::spawn(async move {
            // The entry leaves the set even when the build panics: the guard's drop.
            let guard = Running {
                builds: this.clone(),
                key,
            };
            let action = build.await;
            let (tag, work_item_id) = guard.key.clone();
            let failed = matches!(
                action,
                SiteAction::Failed { .. } | SiteAction::MergeUnverified { .. }
            );
            this.state.send_modify(|state| {
                let key = (tag.clone(), work_item_id.clone());
                if failed {
                    let failures = state.backoff.get(&key).map_or(0, |(n, _)| *n) + 1;
                    state
                        .backoff
                        .insert(key, (failures, Instant::now() + item_backoff(failures)));
                } else {
                    state.backoff.insert(key, (0, Instant::now() + SETTLE));
                }
            });
            drop(guard);
            // The receiver may be gone (the process is stopping): nothing to report to.
            let _ = this.finished.send(Finished {
                tag,
                work_item_id,
                action,
            });
        });
        true
    }

    /// Waits until no build is running.
    pub async fn drained(&self) {
        let mut rx = self.state.subscribe();
        // The sender lives in `self`: the channel cannot close while we wait.
        let _ = rx.wait_for(|state| state.running.is_empty()).await;
    }
}

/// Removes its build from the running set when dropped.
struct Running {
    builds: Builds,
    key: (String, String),
}

impl Drop for Running {
    fn drop(&mut self) {
        self.builds.state.send_modify(|state| {
            state.running.remove(&self.key);
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn failed(id: &str) -> SiteAction {
        SiteAction::Failed {
            work_item_id: id.into(),
            error: "test".into(),
        }
    }

    #[tokio::test]
    async fn a_build_runs_once_reports_its_tag_and_leaves_the_set() {
        let (builds, mut done) = Builds::new();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        assert!(builds.start("ns/p", "wi-1", async move {
            let _ = wait.await;
            failed("wi-1")
        }));
        assert!(builds.is_running("ns/p", "wi-1"));
        assert!(
            !builds.is_running("ns/q", "wi-1"),
            "tags keep projects apart"
        );
        assert!(
            !builds.start("ns/p", "wi-1", async { failed("wi-1") }),
            "an item already building is not started twice"
        );
        assert_eq!(builds.len(), 1);
        go.send(()).unwrap();
        let finished = done.recv().await.unwrap();
        assert_eq!(
            (finished.tag.as_str(), finished.work_item_id.as_str()),
            ("ns/p", "wi-1")
        );
        assert_eq!(finished.action, failed("wi-1"));
        builds.drained().await;
        assert!(builds.is_empty());
        assert!(
            builds.start("ns/p", "wi-1", async { failed("wi-1") }),
            "a finished item may build again"
        );
    }

    #[tokio::test]
    async fn a_failed_build_backs_its_item_off_doubling_and_a_good_one_clears_it() {
        assert_eq!(item_backoff(1), Duration::from_secs(1));
        assert_eq!(item_backoff(2), Duration::from_secs(2));
        assert_eq!(item_backoff(4), Duration::from_secs(8));
        assert_eq!(item_backoff(40), MAX_ITEM_BACKOFF);
        let (builds, mut done) = Builds::new();
        for round in 1..=2u32 {
            builds.start("t", "wi", async { failed("wi") });
            done.recv().await.unwrap();
            let now = Instant::now();
            assert!(
                builds.is_busy("t", "wi", now),
                "backing off after failure {round}"
            );
            assert!(!builds.is_running("t", "wi"));
            assert!(!builds.is_busy(
                "t",
                "wi",
                now + item_backoff(round) + Duration::from_millis(50)
            ));
            assert!(!builds.is_busy("t", "other", now), "only that item waits");
        }
        builds.start("t", "wi", async {
            SiteAction::Claimed {
                work_item_id: "wi".into(),
            }
        });
        done.recv().await.unwrap();
        let now = Instant::now();
        assert!(
            builds.is_busy("t", "wi", now),
            "settling after a good build"
        );
        assert!(
            !builds.is_busy("t", "wi", now + SETTLE + Duration::from_millis(50)),
            "a good build clears the backoff"
        );
        builds.start("t", "wi", async { failed("wi") });
        done.recv().await.unwrap();
        let now = Instant::now();
        assert!(
            !builds.is_busy("t", "wi", now + item_backoff(1) + Duration::from_millis(50)),
            "the count starts again after a good build"
        );
    }

    #[tokio::test]
    async fn a_panicking_build_leaves_the_set_and_drained_waits_for_the_rest() {
        let (builds, mut done) = Builds::new();
        builds.start("t", "boom", async { panic!("the build panicked") });
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        builds.start("t", "slow", async move {
            let _ = wait.await;
            failed("slow")
        });
        let drained = tokio::spawn({
            let builds = builds.clone();
            async move { builds.drained().await }
        });
        for _ in 0..50 {
            if !builds.is_running("t", "boom") {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(!builds.is_running("t", "boom"));
        assert!(!drained.is_finished(), "one build is still running");
        go.send(()).unwrap();
        drained.await.unwrap();
        assert_eq!(done.recv().await.unwrap().work_item_id, "slow");
    }
}
