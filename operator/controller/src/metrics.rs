//! Job Site metrics (ARCHITECTURE.md §6), all prefixed `protobot_`.
//!
//! Counters and histograms are owned by [`JobSiteMetrics`] and registered once
//! with [`JobSiteMetrics::register`]. "How many work items are in each state" is
//! not a gauge kept in sync by hand: [`WorkItemsByState`] is a scrape-time
//! collector that asks a [`StateCounts`] source (the controller's watch cache,
//! or the single-machine store) at every scrape. Failure counters carry an
//! error `category` label derived from the error enum, never free text.
//!
//! Only what this process observes is registered: every family here is recorded
//! where its event happens (a test fails otherwise, see `tests/metrics_exist.rs`).
//! Egress decisions are counted by the egress proxy, which makes them
//! (`protobot_egress_decisions_total` on the proxy's own admin port); sandbox pods
//! by phase are the cluster's (kube-state-metrics' `kube_pod_status_phase`).
//!
//! `protobot_work_items` describes the cluster, not the replica: every replica
//! reports every item from its own watch cache, so any surviving replica answers.
//! Aggregate it with `max` over the replicas, never `sum`; the chart's recording
//! rule `namespace_job_state:protobot_work_items:max` does (docs/monitoring.md).

use std::{sync::Arc, time::Instant};

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    core::{Collector, Desc},
    proto::MetricFamily,
};
use protobot_jobsite::{
    engine::BuildReport,
    inspection::Verdict,
    site::{ClaimRefused, SiteAction},
};
use protobot_lifecycle::State;

/// Where the scrape-time collector reads work-item counts from.
pub trait StateCounts: Send + Sync {
    /// Current number of work items per state (states with no items may be omitted).
    fn counts(&self) -> Vec<(State, u64)>;
}

/// `protobot_work_items{state}`: computed at scrape time, one sample per stored state. The
/// same cluster-wide value on every replica (see the module documentation).
pub struct WorkItemsByState {
    source: Arc<dyn StateCounts>,
    desc: Desc,
    template: IntGaugeVec,
}

impl WorkItemsByState {
    /// A collector reading `source`.
    pub fn new(source: Arc<dyn StateCounts>) -> Result<WorkItemsByState, prometheus::Error> {
        let opts = Opts::new(
            "protobot_work_items",
            "Build work items by lifecycle state, cluster-wide: every replica reports every item; aggregate replicas with max, not sum.",
        );
        let template = IntGaugeVec::new(opts, &["state"])?;
        let desc = template
            .desc()
            .first()
            .map(|d| (*d).clone())
            .ok_or_else(|| {
                prometheus::Error::Msg("work item gauge has no descriptor".to_string())
            })?;
        Ok(WorkItemsByState {
            source,
            desc,
            template,
        })
    }
}

impl Collector for WorkItemsByState {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.template.reset();
        // Every stored state is reported, zero included, so dashboards see gaps.
        for state in State::ALL.iter().filter(|s| **s != State::Initial) {
            self.template.with_label_values(&[state.as_str()]).set(0);
        }
        for (state, n) in self.source.counts() {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.template.with_label_values(&[state.as_str()]).set(n);
        }
        self.template.collect()
    }
}

/// `protobot_build_slots{state}`: this replica's build slots, read at scrape time from the
/// semaphore builds take a permit of — `total` (`--max-concurrent-builds`) and `in_use`.
/// Both are 0 on a replica without a Job Site until [`BuildSlots::attach`]. Per replica:
/// sum them over replicas for the cluster's capacity.
#[derive(Clone)]
pub struct BuildSlots {
    source: Arc<std::sync::Mutex<Option<Capacity>>>,
    desc: Desc,
    template: IntGaugeVec,
}

/// A replica's slot semaphore and the permits it was made with.
type Capacity = (Arc<tokio::sync::Semaphore>, usize);

impl BuildSlots {
    fn new() -> Result<BuildSlots, prometheus::Error> {
        let template = IntGaugeVec::new(
            Opts::new(
                "protobot_build_slots",
                "This replica's build slots: total (--max-concurrent-builds) and in_use.",
            ),
            &["state"],
        )?;
        let desc = template
            .desc()
            .first()
            .map(|d| (*d).clone())
            .ok_or_else(|| prometheus::Error::Msg("build slot gauge has no descriptor".into()))?;
        Ok(BuildSlots {
            source: Arc::default(),
            desc,
            template,
        })
    }

    /// Publishes `capacity` (made with `total` permits) from now on.
    pub fn attach(&self, capacity: Arc<tokio::sync::Semaphore>, total: usize) {
        *self
            .source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((capacity, total));
    }

    /// `(total, in_use)` now.
    pub fn read(&self) -> (usize, usize) {
        match &*self
            .source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            Some((capacity, total)) => (*total, total.saturating_sub(capacity.available_permits())),
            None => (0, 0),
        }
    }
}

impl Collector for BuildSlots {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (total, in_use) = self.read();
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.template
            .with_label_values(&["total"])
            .set(gauge(total));
        self.template
            .with_label_values(&["in_use"])
            .set(gauge(in_use));
        self.template.collect()
    }
}

/// Every counter and histogram of the Job Site.
#[derive(Clone)]
pub struct JobSiteMetrics {
    /// `protobot_build_slots{state}`: this replica's slots (scrape time).
    pub slots: BuildSlots,
    /// `protobot_claims_total{outcome}`: allowed, duplicate, stale, rejected.
    pub claims: IntCounterVec,
    /// `protobot_lease_renewals_total{outcome}`.
    pub lease_renewals: IntCounterVec,
    /// `protobot_lease_expiries_total`.
    pub lease_expiries: IntCounter,
    /// `protobot_triage_cycles`: cycles an item needed.
    pub triage_cycles: Histogram,
    /// `protobot_escalations_total{tier}`.
    pub escalations: IntCounterVec,
    /// `protobot_inspection_runs_total{verdict}`: sealed, rework, blocked.
    pub inspection_runs: IntCounterVec,
    /// `protobot_inspection_findings_total`: findings recorded by this replica's runs.
    pub inspection_findings: IntCounter,
    /// `protobot_merges_total{outcome}`: merged, conflict, not-applied, verify-failed.
    pub merges: IntCounterVec,
    /// `protobot_reconciler_repairs_total{kind}`.
    pub reconciler_repairs: IntCounterVec,
    /// `protobot_reconcile_duration_seconds{controller}`.
    pub reconcile_duration: HistogramVec,
    /// `protobot_reconcile_errors_total{controller,category}`.
    pub reconcile_errors: IntCounterVec,
    /// `protobot_registration_to_completion_seconds`.
    pub registration_to_completion: Histogram,
    /// `protobot_repository_fetches_total{outcome}`: fetches of a project's clone by the
    /// Job Site (`ok`, `failed`); a project's Job Site is kept between dispatches, so this
    /// grows with new items and changes, not with dispatches.
    pub repository_fetches: IntCounterVec,
    /// `protobot_items_queued{project}`: a project's ready items beyond what this replica
    /// can claim now (`namespace/name`; no item ids), as its last dispatch of the project
    /// saw them — the figure `status.queue.queued` of the Project shows. Every replica
    /// reports the projects it dispatches: aggregate replicas with `max`, not `sum`.
    pub items_queued: IntGaugeVec,
}

fn counter_vec(
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Result<Histogram, prometheus::Error> {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
}

impl JobSiteMetrics {
    /// Creates the families and registers them (plus `protobot_work_items`).
    pub fn register(
        registry: &Registry,
        states: Arc<dyn StateCounts>,
    ) -> Result<JobSiteMetrics, prometheus::Error> {
        let seconds = vec![0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0, 3600.0];
        let long = vec![60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0];
        let m = JobSiteMetrics {
            slots: BuildSlots::new()?,
            claims: counter_vec("protobot_claims_total", "Claims by outcome.", &["outcome"])?,
            lease_renewals: counter_vec(
                "protobot_lease_renewals_total",
                "Lease renewals by outcome.",
                &["outcome"],
            )?,
            lease_expiries: IntCounter::new(
                "protobot_lease_expiries_total",
                "Leases that expired before release.",
            )?,
            triage_cycles: histogram(
                "protobot_triage_cycles",
                "Triage cycles a work item needed.",
                vec![0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0],
            )?,
            escalations: counter_vec(
                "protobot_escalations_total",
                "Escalations by target tier.",
                &["tier"],
            )?,
            inspection_runs: counter_vec(
                "protobot_inspection_runs_total",
                "Inspection runs this replica finished, by verdict.",
                &["verdict"],
            )?,
            inspection_findings: IntCounter::new(
                "protobot_inspection_findings_total",
                "Findings recorded by the inspection runs this replica finished.",
            )?,
            merges: counter_vec("protobot_merges_total", "Merges by outcome.", &["outcome"])?,
            reconciler_repairs: counter_vec(
                "protobot_reconciler_repairs_total",
                "Reconciler repairs by kind.",
                &["kind"],
            )?,
            reconcile_duration: HistogramVec::new(
                HistogramOpts::new(
                    "protobot_reconcile_duration_seconds",
                    "Reconcile duration by controller.",
                )
                .buckets(seconds),
                &["controller"],
            )?,
            reconcile_errors: counter_vec(
                "protobot_reconcile_errors_total",
                "Reconcile errors by controller and category.",
                &["controller", "category"],
            )?,
            registration_to_completion: histogram(
                "protobot_registration_to_completion_seconds",
                "Time from change-set registration to completion.",
                long,
            )?,
            repository_fetches: counter_vec(
                "protobot_repository_fetches_total",
                "Fetches of a project's clone by the Job Site, by outcome.",
                &["outcome"],
            )?,
            items_queued: IntGaugeVec::new(
                Opts::new(
                    "protobot_items_queued",
                    "A project's ready items beyond what this replica can claim now (no free slot, WIP limit, no node room, runs refused); aggregate replicas with max.",
                ),
                &["project"],
            )?,
        };
        registry.register(Box::new(m.claims.clone()))?;
        registry.register(Box::new(m.items_queued.clone()))?;
        registry.register(Box::new(m.lease_renewals.clone()))?;
        registry.register(Box::new(m.lease_expiries.clone()))?;
        registry.register(Box::new(m.triage_cycles.clone()))?;
        registry.register(Box::new(m.escalations.clone()))?;
        registry.register(Box::new(m.inspection_runs.clone()))?;
        registry.register(Box::new(m.inspection_findings.clone()))?;
        registry.register(Box::new(m.merges.clone()))?;
        registry.register(Box::new(m.reconciler_repairs.clone()))?;
        registry.register(Box::new(m.reconcile_duration.clone()))?;
        registry.register(Box::new(m.reconcile_errors.clone()))?;
        registry.register(Box::new(m.registration_to_completion.clone()))?;
        registry.register(Box::new(m.repository_fetches.clone()))?;
        registry.register(Box::new(WorkItemsByState::new(states)?))?;
        registry.register(Box::new(m.slots.clone()))?;
        // Known label values start at zero so every family is exposed from the
        // first scrape and rate() and alerts see them before the first event.
        for (family, values) in [
            (
                &m.claims,
                &["allowed", "duplicate", "stale", "rejected"][..],
            ),
            (&m.lease_renewals, &["renewed", "stale", "lost"][..]),
            (&m.repository_fetches, &["ok", "failed"][..]),
            (
                &m.merges,
                &["merged", "conflict", "not-applied", "verify-failed"][..],
            ),
            (&m.inspection_runs, &["sealed", "rework", "blocked"][..]),
            (&m.escalations, &["t1", "t2", "t3", "t4"][..]),
            (
                &m.reconciler_repairs,
                &[
                    "recover-lease",
                    "merge-conflict",
                    "merge-not-applied",
                    "record-merge",
                ][..],
            ),
        ] {
            for v in values {
                family.with_label_values(&[*v]);
            }
        }
        for controller in [
            "project",
            "changeset",
            "bugreport",
            "buildworkitem",
            "inspectionrun",
        ] {
            m.reconcile_duration.with_label_values(&[controller]);
            m.reconcile_errors.with_label_values(&[controller, "none"]);
        }
        Ok(m)
    }

    /// Starts timing one reconcile; the duration is recorded when the guard drops,
    /// and `fail(category)` also counts an error.
    pub fn reconcile(&self, controller: &str) -> ReconcileTimer {
        ReconcileTimer {
            metrics: self.clone(),
            controller: controller.to_string(),
            start: Instant::now(),
        }
    }
}

impl std::fmt::Debug for JobSiteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSiteMetrics").finish_non_exhaustive()
    }
}

/// The `outcome` of a refused claim, by its code: the item moved on under us (`stale`), this
/// Job Site already holds it (`duplicate`), anything else (`rejected`).
pub fn lost_claim_outcome(code: &ClaimRefused) -> &'static str {
    use protobot_lifecycle::Code;
    match code {
        ClaimRefused::Code(
            Code::StaleState
            | Code::StaleContractVersion
            | Code::InvalidTransition
            | Code::PreconditionFailed,
        ) => "stale",
        ClaimRefused::Code(Code::DuplicateClaim) => "duplicate",
        _ => "rejected",
    }
}

impl JobSiteMetrics {
    /// Records what one Job Site pass did: claims and lost claims, lease recoveries and
    /// the reconciler's other repairs, merges (and landings that found `main` moved),
    /// escalations between cycles, cycles per completed item, builds that stopped.
    pub fn record_actions(&self, actions: &[SiteAction]) {
        for action in actions {
            match action {
                SiteAction::Claimed { .. } => self.claims.with_label_values(&["allowed"]).inc(),
                SiteAction::LostClaim { code, .. } => self
                    .claims
                    .with_label_values(&[lost_claim_outcome(code)])
                    .inc(),
                SiteAction::RecoveredLease { .. } => {
                    self.lease_expiries.inc();
                    self.reconciler_repairs
                        .with_label_values(&["recover-lease"])
                        .inc();
                }
                SiteAction::RecordedMerge { .. } => self
                    .reconciler_repairs
                    .with_label_values(&["record-merge"])
                    .inc(),
                SiteAction::MergeNotApplied { .. } => {
                    self.reconciler_repairs
                        .with_label_values(&["merge-not-applied"])
                        .inc();
                    self.merges.with_label_values(&["not-applied"]).inc();
                }
                SiteAction::Built { report } => self.record_build(report),
                SiteAction::MergeUnverified { .. } => {
                    self.merges.with_label_values(&["verify-failed"]).inc();
                    self.reconcile_errors
                        .with_label_values(&["buildworkitem", "build-stopped"])
                        .inc();
                }
                SiteAction::Failed { .. } => self
                    .reconcile_errors
                    .with_label_values(&["buildworkitem", "build-stopped"])
                    .inc(),
                SiteAction::DependenciesRefreshed { .. } | SiteAction::Revalidated { .. } => {}
            }
        }
    }

    fn record_build(&self, report: &BuildReport) {
        let renewals = report.lease_renewals;
        self.lease_renewals
            .with_label_values(&["renewed"])
            .inc_by(u64::from(renewals.renewed));
        self.lease_renewals
            .with_label_values(&["stale"])
            .inc_by(u64::from(renewals.failed));
        // Each revalidation is a landing that found the default branch moved.
        self.merges
            .with_label_values(&["conflict"])
            .inc_by(u64::from(report.revalidations));
        for pair in report.cycles.windows(2) {
            if pair[1].tier > pair[0].tier {
                let tier = serde_json::to_value(pair[1].tier)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                self.escalations.with_label_values(&[tier.as_str()]).inc();
            }
        }
        for run in &report.inspections {
            let verdict = match run.verdict {
                Verdict::Sealed { .. } => "sealed",
                Verdict::Rework { .. } => "rework",
                Verdict::Blocked { .. } => "blocked",
            };
            self.inspection_runs.with_label_values(&[verdict]).inc();
            self.inspection_findings
                .inc_by(u64::try_from(run.findings).unwrap_or(u64::MAX));
        }
        if report.state == State::Completed && report.merge_commit.is_some() {
            self.merges.with_label_values(&["merged"]).inc();
            self.triage_cycles.observe(report.cycles.len() as f64);
        }
    }
}

/// Drop-based reconcile timer.
pub struct ReconcileTimer {
    metrics: JobSiteMetrics,
    controller: String,
    start: Instant,
}

impl ReconcileTimer {
    /// Counts a failed reconcile under the error's stable category.
    pub fn fail(&self, category: &str) {
        self.metrics
            .reconcile_errors
            .with_label_values(&[self.controller.as_str(), category])
            .inc();
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.metrics
            .reconcile_duration
            .with_label_values(&[self.controller.as_str()])
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use protobot_jobsite::{
        engine::{BuildReport, CycleReport},
        escalation::Tier,
    };

    use super::*;

    struct NoCounts;

    impl StateCounts for NoCounts {
        fn counts(&self) -> Vec<(State, u64)> {
            Vec::new()
        }
    }

    fn cycle(n: u32, tier: Tier) -> CycleReport {
        CycleReport {
            cycle: n,
            decision: "implementation".into(),
            feedback: Vec::new(),
            redactions: 0,
            projection_files_scanned: 0,
            tier,
        }
    }

    fn built(state: State, tiers: &[Tier], revalidations: u32) -> SiteAction {
        SiteAction::Built {
            report: Box::new(BuildReport {
                work_item_id: "wi-1".into(),
                state,
                cycles: tiers
                    .iter()
                    .enumerate()
                    .map(|(i, t)| cycle(i as u32 + 1, *t))
                    .collect(),
                inspections: Vec::new(),
                revalidations,
                merge_commit: (state == State::Completed).then(|| "abc".into()),
                product_tree_digest: None,
                block_reason: None,
                lease_renewals: protobot_jobsite::lease::LeaseRenewals {
                    renewed: 4,
                    failed: 1,
                },
                usage: Default::default(),
            }),
        }
    }

    #[test]
    fn a_pass_is_counted_by_what_it_did() {
        let m = JobSiteMetrics::register(&Registry::new(), Arc::new(NoCounts)).unwrap();
        let id = || "wi-1".to_owned();
        m.record_actions(&[
            SiteAction::Claimed { work_item_id: id() },
            SiteAction::LostClaim {
                work_item_id: id(),
                code: ClaimRefused::Code(protobot_lifecycle::Code::StaleContractVersion),
            },
            SiteAction::LostClaim {
                work_item_id: id(),
                code: ClaimRefused::Code(protobot_lifecycle::Code::DuplicateClaim),
            },
            SiteAction::LostClaim {
                work_item_id: id(),
                code: ClaimRefused::Code(protobot_lifecycle::Code::UnauthorizedAction),
            },
            SiteAction::RecoveredLease { work_item_id: id() },
            SiteAction::MergeNotApplied { work_item_id: id() },
            SiteAction::RecordedMerge {
                work_item_id: id(),
                merge_commit: "abc".into(),
            },
            SiteAction::Failed {
                work_item_id: id(),
                error: "boom".into(),
            },
            built(State::Completed, &[Tier::T1, Tier::T1, Tier::T2], 1),
            // Resumed into blocked: no merge, no cycles observed.
            built(State::Blocked, &[Tier::T2, Tier::T3], 0),
        ]);
        let claims = |o: &str| m.claims.with_label_values(&[o]).get();
        assert_eq!(
            [
                claims("allowed"),
                claims("stale"),
                claims("duplicate"),
                claims("rejected")
            ],
            [1, 1, 1, 1]
        );
        assert_eq!(m.lease_expiries.get(), 1);
        // Two builds reported 4 renewals and 1 unanswered attempt each.
        let renewals = |o: &str| m.lease_renewals.with_label_values(&[o]).get();
        assert_eq!([renewals("renewed"), renewals("stale")], [8, 2]);
        let repairs = |k: &str| m.reconciler_repairs.with_label_values(&[k]).get();
        assert_eq!(
            [
                repairs("recover-lease"),
                repairs("merge-not-applied"),
                repairs("record-merge")
            ],
            [1, 1, 1]
        );
        let merges = |o: &str| m.merges.with_label_values(&[o]).get();
        assert_eq!(
            [merges("merged"), merges("not-applied"), merges("conflict")],
            [1, 1, 1]
        );
        let escalations = |t: &str| m.escalations.with_label_values(&[t]).get();
        assert_eq!([escalations("t2"), escalations("t3")], [1, 1]);
        assert_eq!(m.triage_cycles.get_sample_count(), 1);
        assert!((m.triage_cycles.get_sample_sum() - 3.0).abs() < f64::EPSILON);
        assert_eq!(
            m.reconcile_errors
                .with_label_values(&["buildworkitem", "build-stopped"])
                .get(),
            1
        );
    }

    fn inspection(verdict: Verdict, findings: usize) -> protobot_jobsite::engine::InspectionReport {
        protobot_jobsite::engine::InspectionReport {
            run_id: "run-1".into(),
            candidate: "c".into(),
            product_tree_digest: "d".into(),
            contract_version: 1,
            ledger_sequence_at_start: 0,
            producers: vec!["inspector".into()],
            findings,
            verdict,
        }
    }

    #[tokio::test]
    async fn build_slots_are_read_from_the_semaphore_at_scrape_time() {
        let registry = Registry::new();
        let m = JobSiteMetrics::register(&registry, Arc::new(NoCounts)).unwrap();
        let sample = |state: &str| {
            registry
                .gather()
                .into_iter()
                .find(|f| f.name() == "protobot_build_slots")
                .and_then(|f| {
                    f.get_metric()
                        .iter()
                        .find(|s| s.get_label().iter().any(|l| l.value() == state))
                        .map(|s| s.get_gauge().get_value())
                })
        };
        // No Job Site in this replica: the family is there, at zero.
        assert_eq!((sample("total"), sample("in_use")), (Some(0.0), Some(0.0)));
        let capacity = Arc::new(tokio::sync::Semaphore::new(3));
        m.slots.attach(Arc::clone(&capacity), 3);
        let first = Arc::clone(&capacity).acquire_owned().await.unwrap();
        let second = Arc::clone(&capacity).acquire_owned().await.unwrap();
        assert_eq!((sample("total"), sample("in_use")), (Some(3.0), Some(2.0)));
        drop(first);
        assert_eq!(sample("in_use"), Some(1.0));
        drop(second);
        assert_eq!(sample("in_use"), Some(0.0));
    }

    #[test]
    fn inspection_runs_are_counted_by_verdict_with_their_findings() {
        let m = JobSiteMetrics::register(&Registry::new(), Arc::new(NoCounts)).unwrap();
        let SiteAction::Built { mut report } = built(State::Completed, &[Tier::T1], 0) else {
            unreachable!("built() builds a Built action")
        };
        report.inspections = vec![
            inspection(Verdict::Rework { routed: Vec::new() }, 3),
            inspection(Verdict::Sealed { watermark: 7 }, 2),
        ];
        m.record_actions(&[SiteAction::Built { report }]);
        let runs = |v: &str| m.inspection_runs.with_label_values(&[v]).get();
        assert_eq!([runs("sealed"), runs("rework"), runs("blocked")], [1, 1, 0]);
        assert_eq!(m.inspection_findings.get(), 5);
    }

    #[test]
    fn an_unverified_merge_counts_as_verify_failed_and_a_stopped_build() {
        let m = JobSiteMetrics::register(&Registry::new(), Arc::new(NoCounts)).unwrap();
        let verify_failed = || m.merges.with_label_values(&["verify-failed"]).get();
        let stopped = || {
            m.reconcile_errors
                .with_label_values(&["buildworkitem", "build-stopped"])
                .get()
        };
        assert_eq!((verify_failed(), stopped()), (0, 0));
        m.record_actions(&[SiteAction::MergeUnverified {
            work_item_id: "wi-1".into(),
            error: "the remote does not contain the merge".into(),
        }]);
        assert_eq!((verify_failed(), stopped()), (1, 1));
    }
}
