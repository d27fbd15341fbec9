//! Progressive escalation: which worker tier an attempt runs at, and how many
//! retries each error class gets (ARCHITECTURE.md §5).
//!
//! A work item starts at its WorkerClass's cheapest tier and moves up only on
//! *genuine* failures (a failed gate, a rejected inspection); transient errors
//! (timeouts, executor errors, rate limits, network, image pulls) retry at the
//! same tier within their own budget. The attempt history is persisted in the
//! work item, so a restarted Job Site resumes at the right tier by replaying it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Worker tiers, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Cheapest.
    T1,
    /// Second.
    T2,
    /// Third.
    T3,
    /// Most capable.
    T4,
}

impl Tier {
    /// The tier of the `n`-th genuine attempt (0-based) for an item that starts at `self`.
    ///
    /// Starting at t1 the attempts run t1, t1, t2, t3, then t4 forever; at t2:
    /// t2, t2, t3, t4, t4…; at t3: t3, t4, t4…; at t4: t4 always.
    pub fn for_attempt(self, n: usize) -> Tier {
        let schedule: &[Tier] = match self {
            Tier::T1 => &[Tier::T1, Tier::T1, Tier::T2, Tier::T3],
            Tier::T2 => &[Tier::T2, Tier::T2, Tier::T3],
            Tier::T3 => &[Tier::T3],
            Tier::T4 => &[],
        };
        schedule.get(n).copied().unwrap_or(Tier::T4)
    }
}

/// Why an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The attempt did what it was asked.
    Succeeded,
    /// The building gate failed (tests still failing after the cycle).
    FailedGate,
    /// Inspection rejected the candidate.
    RejectedInspection,
    /// Tests failed within a cycle (escalates after its budget).
    TestFailure,
    /// A network error.
    Network,
    /// A git conflict while integrating.
    GitConflict,
    /// A provider rate limit.
    RateLimit,
    /// The sandbox exceeded its deadline.
    Timeout,
    /// The executor failed (image pull, scheduling, crash of the harness).
    ExecutorError,
}

impl Outcome {
    /// Genuine failures move the tier up; transient ones never do.
    pub fn is_genuine_failure(self) -> bool {
        matches!(
            self,
            Outcome::FailedGate | Outcome::RejectedInspection | Outcome::TestFailure
        )
    }

    /// The retry policy of this class, `None` for success.
    pub fn retry_policy(self) -> Option<RetryPolicy> {
        use Backoff::*;
        let (budget, backoff) = match self {
            Outcome::Succeeded => return None,
            Outcome::Network | Outcome::Timeout | Outcome::ExecutorError => (
                3,
                Exponential {
                    base: Duration::from_secs(1),
                    cap: Duration::from_secs(60),
                },
            ),
            Outcome::GitConflict => (2, Fixed(Duration::ZERO)),
            Outcome::TestFailure | Outcome::FailedGate | Outcome::RejectedInspection => {
                (3, Fixed(Duration::ZERO))
            }
            Outcome::RateLimit => (5, Fixed(Duration::from_secs(60))),
        };
        Some(RetryPolicy { budget, backoff })
    }
}

/// How long to wait before a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backoff {
    /// Always the same delay.
    Fixed(Duration),
    /// `base * 2^(retry-1)`, capped.
    Exponential {
        /// First delay.
        base: Duration,
        /// Ceiling.
        cap: Duration,
    },
}

/// Retries allowed for one error class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How many retries the class gets.
    pub budget: u32,
    /// Delay between them.
    pub backoff: Backoff,
}

impl RetryPolicy {
    /// The delay before retry number `retry` (1-based), `None` past the budget.
    pub fn delay(&self, retry: u32) -> Option<Duration> {
        if retry == 0 || retry > self.budget {
            return None;
        }
        Some(match self.backoff {
            Backoff::Fixed(d) => d,
            Backoff::Exponential { base, cap } => {
                let factor = 1u32.checked_shl(retry - 1).unwrap_or(u32::MAX);
                base.checked_mul(factor).unwrap_or(cap).min(cap)
            }
        })
    }
}

/// One persisted attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The tier it ran at.
    pub tier: Tier,
    /// How it ended.
    pub outcome: Outcome,
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Run again at this tier after this delay.
    Retry {
        /// Tier of the next attempt.
        tier: Tier,
        /// Delay before it.
        after: Duration,
    },
    /// The class exhausted its budget: stop and surface it (block or fail).
    GiveUp {
        /// The class that ran out.
        outcome: Outcome,
    },
    /// Nothing left to do.
    Done,
}

/// The escalation state of a work item, rebuilt from its persisted history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Escalation {
    /// The WorkerClass's cheapest tier.
    pub start: Tier,
    /// Every attempt so far, oldest first.
    pub history: Vec<Attempt>,
}

impl Escalation {
    /// A fresh item starting at `start`.
    pub fn new(start: Tier) -> Escalation {
        Escalation {
            start,
            history: Vec::new(),
        }
    }

    /// The tier the next attempt runs at: the start tier advanced by the number
    /// of genuine failures so far.
    pub fn current_tier(&self) -> Tier {
        let genuine = self
            .history
            .iter()
            .filter(|a| a.outcome.is_genuine_failure())
            .count();
        self.start.for_attempt(genuine)
    }

    /// Records an attempt and says what comes next.
    pub fn record(&mut self, outcome: Outcome) -> Next {
        let tier = self.current_tier();
        self.history.push(Attempt { tier, outcome });
        let Some(policy) = outcome.retry_policy() else {
            return Next::Done;
        };
        // Retries of this class since the last attempt of a different class.
        let streak = self
            .history
            .iter()
            .rev()
            .take_while(|a| a.outcome == outcome)
            .count() as u32;
        match policy.delay(streak) {
            Some(after) => Next::Retry {
                tier: self.current_tier(),
                after,
            },
            None => Next::GiveUp { outcome },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(start: Tier, n: usize) -> Vec<Tier> {
        (0..n).map(|i| start.for_attempt(i)).collect()
    }

    #[test]
    fn default_schedules_follow_the_architecture() {
        use Tier::*;
        assert_eq!(schedule(T1, 6), [T1, T1, T2, T3, T4, T4]);
        assert_eq!(schedule(T2, 5), [T2, T2, T3, T4, T4]);
        assert_eq!(schedule(T3, 3), [T3, T4, T4]);
        assert_eq!(schedule(T4, 3), [T4, T4, T4]);
    }

    #[test]
    fn transient_failures_never_escalate() {
        let mut e = Escalation::new(Tier::T1);
        for outcome in [
            Outcome::Timeout,
            Outcome::ExecutorError,
            Outcome::RateLimit,
            Outcome::Network,
        ] {
            e.record(outcome);
        }
        assert_eq!(e.current_tier(), Tier::T1);
        e.record(Outcome::FailedGate);
        e.record(Outcome::RejectedInspection);
        assert_eq!(
            e.current_tier(),
            Tier::T2,
            "two genuine failures from t1 reach t2"
        );
    }

    #[test]
    fn a_restart_resumes_at_the_persisted_tier() {
        let mut e = Escalation::new(Tier::T2);
        for _ in 0..3 {
            e.record(Outcome::FailedGate);
        }
        let persisted = serde_json::to_string(&e).unwrap();
        let resumed: Escalation = serde_json::from_str(&persisted).unwrap();
        assert_eq!(resumed.current_tier(), Tier::T4);
        assert_eq!(resumed, e);
    }

    #[test]
    fn budgets_and_backoff_per_class() {
        let net = Outcome::Network.retry_policy().unwrap();
        let delays: Vec<_> = (1..=4).map(|r| net.delay(r)).collect();
        assert_eq!(
            delays,
            [
                Some(Duration::from_secs(1)),
                Some(Duration::from_secs(2)),
                Some(Duration::from_secs(4)),
                None
            ]
        );
        let capped = RetryPolicy {
            budget: 10,
            backoff: Backoff::Exponential {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(60),
            },
        };
        assert_eq!(capped.delay(10), Some(Duration::from_secs(60)));
        assert_eq!(Outcome::GitConflict.retry_policy().unwrap().budget, 2);
        assert_eq!(Outcome::TestFailure.retry_policy().unwrap().budget, 3);
        let rl = Outcome::RateLimit.retry_policy().unwrap();
        assert_eq!((rl.budget, rl.delay(5)), (5, Some(Duration::from_secs(60))));
    }

    #[test]
    fn a_class_gives_up_after_its_budget() {
        let mut e = Escalation::new(Tier::T1);
        assert!(matches!(e.record(Outcome::GitConflict), Next::Retry { .. }));
        assert!(matches!(e.record(Outcome::GitConflict), Next::Retry { .. }));
        assert_eq!(
            e.record(Outcome::GitConflict),
            Next::GiveUp {
                outcome: Outcome::GitConflict
            }
        );
        assert_eq!(e.record(Outcome::Succeeded), Next::Done);
        assert!(
            matches!(e.record(Outcome::GitConflict), Next::Retry { .. }),
            "a new streak has a fresh budget"
        );
    }

    #[test]
    fn test_failures_escalate_while_retrying() {
        let mut e = Escalation::new(Tier::T1);
        assert_eq!(
            e.record(Outcome::TestFailure),
            Next::Retry {
                tier: Tier::T1,
                after: Duration::ZERO
            }
        );
        assert_eq!(
            e.record(Outcome::TestFailure),
            Next::Retry {
                tier: Tier::T2,
                after: Duration::ZERO
            }
        );
        assert_eq!(
            e.record(Outcome::TestFailure),
            Next::Retry {
                tier: Tier::T3,
                after: Duration::ZERO
            }
        );
        assert_eq!(
            e.record(Outcome::TestFailure),
            Next::GiveUp {
                outcome: Outcome::TestFailure
            }
        );
    }
}
