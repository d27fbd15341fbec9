//! Holding a claim: the lease a Job Site renews at a third of its duration, the
//! fence every side effect presents, and the cancel signal that stops work at
//! the next effect boundary once the lease is lost.
//!
//! The claim result carries the fencing token and the new contract version;
//! every later command the engine sends (renew-lease, tests-pass, begin-merge…)
//! bumps the version, so the engine records each accepted command in the shared
//! [`Claim`] and the keeper always renews with current expectations. A renewal
//! rejected with a stale fence, state or version — another actor moved the
//! item — means the lease is gone: the keeper flips the cancel signal and stops.
//! Lease time comes from the trusted [`Clock`] only.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use jiff::Timestamp;
use protobot_lifecycle::{
    AuthorizationContext, Code, Command, CommandRequest, FencingToken, OperationEnvelope,
    ResultEnvelope, State,
};
use protobot_stores::{StoreError, WorkStore};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The trusted clock (the operator's; never a caller's).
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// What the engine knows of a claim it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Work item.
    pub work_item_id: String,
    /// Live fence (the token the claim's, or the last fence-issuing command's, decision
    /// issued).
    pub fencing_token: FencingToken,
    /// Current state.
    pub state: State,
    /// Current contract version.
    pub contract_version: u64,
}

/// Why the engine must stop touching the item.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseLost {
    /// A renewal or command was rejected: the lease belongs to someone else now.
    #[error("lease on {work_item_id} lost: {code}")]
    Rejected {
        /// Work item.
        work_item_id: String,
        /// The rejection.
        code: Code,
    },
    /// The store failed repeatedly, or in a way retrying cannot fix; the lease may
    /// expire unseen.
    #[error("lease on {work_item_id} could not be renewed: {reason}")]
    Unreachable {
        /// Work item.
        work_item_id: String,
        /// Why.
        reason: String,
        /// Whether the failure may pass by itself ([`StoreError::is_transient`]): the
        /// keeper tries again at the next tick only then.
        transient: bool,
    },
}

/// A claim shared between the engine and its keeper.
#[derive(Clone, Debug)]
pub struct Claim {
    held: Arc<Mutex<Held>>,
    lost_tx: Arc<watch::Sender<bool>>,
    lost_rx: watch::Receiver<bool>,
    exclusive: Arc<tokio::sync::Mutex<()>>,
    renewed: Arc<std::sync::atomic::AtomicU32>,
    failed: Arc<std::sync::atomic::AtomicU32>,
}

/// Lease renewals of one claim: accepted, and attempts the store could not answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRenewals {
    /// Renewals the store accepted.
    pub renewed: u32,
    /// Renewals that failed without an answer (the store was unreachable).
    pub failed: u32,
}

impl Claim {
    /// Wraps a fresh claim.
    pub fn new(held: Held) -> Claim {
        let (tx, rx) = watch::channel(false);
        Claim {
            held: Arc::new(Mutex::new(held)),
            lost_tx: Arc::new(tx),
            lost_rx: rx,
            exclusive: Arc::new(tokio::sync::Mutex::new(())),
            renewed: Arc::default(),
            failed: Arc::default(),
        }
    }

    /// The renewals made under this claim so far (every clone counts together).
    pub fn renewals(&self) -> LeaseRenewals {
        use std::sync::atomic::Ordering::Relaxed;
        LeaseRenewals {
            renewed: self.renewed.load(Relaxed),
            failed: self.failed.load(Relaxed),
        }
    }

    /// Serializes the claim's store writes: every lifecycle command and renewal
    /// moves the contract version, so the keeper and the engine take turns.
    pub async fn exclusive(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.exclusive.lock().await
    }

    /// A snapshot of what is held.
    pub fn held(&self) -> Option<Held> {
        self.held.lock().ok().map(|h| h.clone())
    }

    /// The signal an executor watches: true once the lease is lost.
    pub fn lost_signal(&self) -> watch::Receiver<bool> {
        self.lost_rx.clone()
    }

    /// The effect boundary: call before every side effect.
    pub fn check(&self) -> Result<Held, LeaseLost> {
        let held = self.held().ok_or_else(|| LeaseLost::Unreachable {
            work_item_id: String::new(),
            reason: "claim state poisoned".into(),
            transient: false,
        })?;
        if *self.lost_rx.borrow() {
            return Err(LeaseLost::Rejected {
                work_item_id: held.work_item_id,
                code: Code::StaleFencingToken,
            });
        }
        Ok(held)
    }

    /// Marks the lease lost (idempotent).
    pub fn mark_lost(&self) {
        let _ = self.lost_tx.send(true);
    }

    /// Records an accepted command's result (state, version, maybe a new fence).
    pub fn record(&self, result: &ResultEnvelope) {
        let Some(d) = result.decision.as_ref().filter(|_| result.ok) else {
            return;
        };
        let (Some(after), Ok(mut held)) = (d.after, self.held.lock()) else {
            return;
        };
        held.state = after.state;
        held.contract_version = after.contract_version;
        if let Some(token) = &d.fencing_token_issued {
            held.fencing_token = token.clone();
        }
    }

    /// A fenced command envelope with the current expectations.
    pub fn command(&self, command: Command, key: &str) -> Result<OperationEnvelope, LeaseLost> {
        let held = self.check()?;
        Ok(OperationEnvelope::command(CommandRequest {
            command,
            actor_context_ref: "job-site",
            work_item_id: &held.work_item_id,
            expected_state: held.state,
            expected_contract_version: held.contract_version,
            idempotency_key: key.to_owned(),
        })
        .fenced(held.fencing_token))
    }
}

/// Renews once. The idempotency key is derived from the version being renewed,
/// so a retried renewal after a lost response replays instead of double-bumping.
pub async fn renew_once<S: WorkStore>(
    store: &S,
    ctx: &AuthorizationContext,
    claim: &Claim,
    clock: &dyn Clock,
) -> Result<(), LeaseLost> {
    let held = claim.check()?;
    let key = format!(
        "renew:{}:{}:{}",
        held.work_item_id, held.fencing_token, held.contract_version
    );
    let env = claim.command(Command::RenewLease, &key)?;
    match store.execute(Some(ctx), &env, clock.now()).await {
        Ok(r) if r.ok => {
            claim.record(&r);
            claim
                .renewed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        Ok(r) => {
            claim.mark_lost();
            Err(LeaseLost::Rejected {
                work_item_id: held.work_item_id,
                code: r.code().unwrap_or(Code::StaleFencingToken),
            })
        }
        Err(e) => {
            claim
                .failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(unreachable(held.work_item_id, &e))
        }
    }
}

/// A renewal the store could not answer.
fn unreachable(work_item_id: String, err: &StoreError) -> LeaseLost {
    LeaseLost::Unreachable {
        work_item_id,
        reason: err.to_string(),
        transient: err.is_transient(),
    }
}

/// Renews every `lease / 3` until the claim is lost or released (`stop` true).
/// Transient store failures are retried at the next tick; if renewals keep
/// failing until less than one tick of lease remains, the claim is marked lost
/// so work stops before another Job Site can take over. A failure that waits
/// for a person (a record the store cannot decode, an object it did not write)
/// marks the claim lost at once: no later renewal can succeed.
pub async fn keep_alive<S: WorkStore>(
    store: Arc<S>,
    ctx: AuthorizationContext,
    claim: Claim,
    clock: Arc<dyn Clock>,
    lease: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<(), LeaseLost> {
    let every = lease / 3;
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return Ok(()),
        }
        if *stop.borrow() {
            return Ok(());
        }
        let renewed = {
            let _exclusive = claim.exclusive().await;
            renew_once(store.as_ref(), &ctx, &claim, clock.as_ref()).await
        };
        match renewed {
            Ok(()) => failures = 0,
            Err(lost @ LeaseLost::Rejected { .. }) => return Err(lost),
            Err(LeaseLost::Unreachable {
                work_item_id,
                reason,
                transient,
            }) => {
                failures += 1;
                tracing::warn!(work_item = %work_item_id, %reason, transient, failures, "lease renewal failed");
                // Two missed renewals leave at most a third of the lease.
                if failures >= 2 || !transient {
                    claim.mark_lost();
                    return Err(LeaseLost::Unreachable {
                        work_item_id,
                        reason,
                        transient,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use protobot_lifecycle::{
        ApprovalRecord, AuditEvent, FencingToken, Submission, WorkItemRecord,
    };
    use protobot_stores::{
        FindingRecord, Import, ItemFilter, Observation, RequestRecord, StoreError,
    };

    use super::*;

    /// A store whose every call fails with what `fail` makes.
    struct Failing {
        fail: fn() -> StoreError,
    }

    impl WorkStore for Failing {
        fn project_id(&self) -> String {
            "p".into()
        }
        async fn execute(
            &self,
            _: Option<&AuthorizationContext>,
            _: &OperationEnvelope,
            _: Timestamp,
        ) -> Result<ResultEnvelope, StoreError> {
            Err((self.fail)())
        }
        async fn get(&self, _: &str) -> Result<Option<WorkItemRecord>, StoreError> {
            Err((self.fail)())
        }
        async fn list(&self, _: &ItemFilter) -> Result<Vec<WorkItemRecord>, StoreError> {
            Err((self.fail)())
        }
        async fn observe(&self, _: &str, _: Observation) -> Result<(), StoreError> {
            Err((self.fail)())
        }
        async fn import(&self, _: Import) -> Result<(), StoreError> {
            Err((self.fail)())
        }
        async fn findings(&self, _: &str) -> Result<Vec<FindingRecord>, StoreError> {
            Err((self.fail)())
        }
        async fn audit_events(&self) -> Result<Vec<AuditEvent>, StoreError> {
            Err((self.fail)())
        }
        async fn approval(&self, _: &str) -> Result<Option<ApprovalRecord>, StoreError> {
            Err((self.fail)())
        }
        async fn submission(&self, _: &str) -> Result<Option<Submission>, StoreError> {
            Err((self.fail)())
        }
        async fn request(&self, _: &str) -> Result<Option<RequestRecord>, StoreError> {
            Err((self.fail)())
        }
    }

    fn claim() -> Claim {
        Claim::new(Held {
            work_item_id: "wi-1".into(),
            fencing_token: FencingToken::from("fence-1"),
            state: State::Building,
            contract_version: 2,
        })
    }

    /// Runs a keeper on `store` until it gives up; how long that took.
    async fn keep_until_lost(fail: fn() -> StoreError) -> (LeaseLost, Duration, Claim) {
        let claim = claim();
        let (_stop_tx, stop) = watch::channel(false);
        let started = tokio::time::Instant::now();
        let lost = keep_alive(
            Arc::new(Failing { fail }),
            AuthorizationContext::default(),
            claim.clone(),
            Arc::new(SystemClock),
            Duration::from_secs(900),
            stop,
        )
        .await
        .expect_err("a keeper on a failing store gives up");
        (lost, started.elapsed(), claim)
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_failure_is_retried_at_the_next_tick() {
        let (lost, took, claim) = keep_until_lost(|| {
            StoreError::backend(
                "write the status of work item wi-1",
                std::io::Error::other("connection refused"),
            )
        })
        .await;
        assert!(
            matches!(&lost, LeaseLost::Unreachable { transient: true, reason, .. }
                if reason.contains("connection refused")),
            "{lost:?}"
        );
        assert_eq!(took, Duration::from_secs(600), "two ticks of a third each");
        assert!(*claim.lost_signal().borrow());
        assert_eq!(claim.renewals().failed, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_that_needs_a_person_loses_the_claim_at_once() {
        let (lost, took, claim) = keep_until_lost(|| {
            StoreError::undecodable(
                "the ledger of BuildWorkItem wi-1",
                std::io::Error::other("expected value"),
            )
        })
        .await;
        assert!(
            matches!(&lost, LeaseLost::Unreachable { transient: false, reason, .. }
                if reason.contains("cannot decode the ledger of BuildWorkItem wi-1")),
            "{lost:?}"
        );
        assert_eq!(took, Duration::from_secs(300), "one tick");
        assert!(*claim.lost_signal().borrow());
        assert_eq!(claim.renewals().failed, 1);
    }
}
