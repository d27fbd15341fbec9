//! Resume: [`Engine::build`] reads the item's state and attempts from the store and runs the
//! stage they call for, again and again, until the item is completed or blocked; a stale claim
//! stops it. Also the two ways a build blocks (a block marker, then a spec question).

use std::{collections::BTreeSet, path::Path};

use git2::Oid;
use protobot_lifecycle::{AttemptRecord, State};
use protobot_repo::{
    catalog::ChangeScope, integrate::WorkItemRef, integrate::ensure_work_item_branch,
};
use protobot_stores::WorkStore;
use tracing::Instrument;

use super::{
    Engine,
    effects::{Fenced, Item},
    error::{EngineError, git_err},
    history::{BLOCKED_OUTCOME, tier_label},
    report::{BuildReport, Progress},
};
use crate::{
    contract::BuildContract, executor::Executor, landing::Landing, lease::Claim,
    repo_folder::RepoFolder,
};

impl<S: WorkStore, E: Executor> Engine<S, E> {
    /// Builds (or resumes) a claimed item from its contract in the integration
    /// repository `repo_dir`, until it is completed or blocked.
    pub async fn build(
        &self,
        claim: &Claim,
        contract: &BuildContract,
        repo_dir: &Path,
    ) -> Result<BuildReport, EngineError> {
        self.build_landing(claim, contract, repo_dir, &self.config.landing)
            .await
    }

    /// [`Engine::build`], landing as `landing` says (a direct push, or through a pull request
    /// on the forge: `crate::landing`).
    pub async fn build_landing(
        &self,
        claim: &Claim,
        contract: &BuildContract,
        repo_dir: &Path,
        landing: &Landing,
    ) -> Result<BuildReport, EngineError> {
        let id = contract.work_item_id.as_str();
        let repo = RepoFolder::new(repo_dir);
        let wi = WorkItemRef {
            id: id.to_string(),
            slug: protobot_lifecycle::BUILD_BRANCH_SLUG.into(),
        };
        let source =
            Oid::from_str(&contract.spec_commit).map_err(git_err("parse the spec commit"))?;
        {
            let wi = wi.clone();
            repo.repo(move |repo| {
                ensure_work_item_branch(repo, &wi, source)
                    .map(drop)
                    .map_err(git_err("create the work-item branch"))
            })
            .await
            .map_err(git_err("open the integration repository"))??;
        }
        // Added requirements have no prior tests to quarantine; only revisions do.
        let revised = if contract.change_type == "changes" {
            contract.changed_requirement_ids.iter().cloned().collect()
        } else {
            BTreeSet::new()
        };
        let item = Item {
            id,
            landing,
            contract,
            repo,
            wi,
            scope: ChangeScope {
                revised,
                retired: contract.retired_requirement_ids.iter().cloned().collect(),
                // Tests this build wrote are Worker A's own in every later cycle.
                build_base: Some(contract.spec_commit.clone()),
                ..ChangeScope::default()
            },
            approved: contract
                .applicable_requirement_ids
                .iter()
                .cloned()
                .collect(),
        };
        let mut progress = Progress::default();
        loop {
            // Read under the claim's lock so a concurrent renewal cannot make the
            // held version and the stored one look different.
            let (held, record) = {
                let _exclusive = claim.exclusive().await;
                let held = claim.check()?;
                let record = self.store.get(id).await?.ok_or_else(|| {
                    protobot_stores::StoreError::NotFound(format!("work item {id}"))
                })?;
                (held, record)
            };
            if record.contract_version != held.contract_version || record.state != held.state {
                // Someone else moved the item: the claim is stale.
                claim.mark_lost();
                return Err(EngineError::Rejected {
                    work_item_id: id.into(),
                    command: "resume".into(),
                    code: "STALE_CONTRACT_VERSION".into(),
                });
            }
            match record.state {
                // Each stage's future is boxed: the build's own future stays small, and so
                // does the stack a runtime thread needs to poll it.
                State::Building => {
                    Box::pin(self.building(claim, &item, &record, &mut progress)).await?
                }
                State::Inspecting => {
                    Box::pin(self.inspecting(claim, &item, &record, &mut progress))
                        .instrument(tracing::info_span!("stage.inspection", work_item = id))
                        .await?
                }
                State::Merging => {
                    Box::pin(self.merging(claim, &item, &record, &mut progress))
                        .instrument(tracing::info_span!("stage.merge", work_item = id))
                        .await?
                }
                State::Completed | State::Blocked => {
                    return Ok(BuildReport {
                        work_item_id: id.into(),
                        state: record.state,
                        cycles: progress.cycles,
                        inspections: progress.inspections,
                        revalidations: progress.revalidations,
                        merge_commit: progress.merge_commit.or_else(|| {
                            record
                                .expected_merge
                                .as_ref()
                                .map(|m| m.merge_commit.clone())
                                .filter(|m| !m.is_empty())
                        }),
                        product_tree_digest: progress.digest.or_else(|| {
                            record
                                .expected_merge
                                .as_ref()
                                .map(|m| m.product_tree_digest.clone())
                                .filter(|d| !d.is_empty())
                        }),
                        block_reason: Some(record.block_reason.clone()).filter(|r| !r.is_empty()),
                        lease_renewals: claim.renewals(),
                        usage: record.usage.clone(),
                    });
                }
                other => {
                    return Err(EngineError::NotDrivable {
                        work_item_id: id.into(),
                        state: other,
                    });
                }
            }
        }
    }

    /// Records that the item blocks at `cycle` (an attempt with outcome
    /// [`BLOCKED_OUTCOME`]): attempts before it no longer count against the
    /// budget once the block is resolved, and the next cycle gets a new number.
    pub(super) async fn record_block_marker(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        cycle: u32,
    ) -> Result<(), EngineError> {
        let now = self.clock.now();
        self.record_attempt(
            claim,
            item,
            AttemptRecord {
                cycle,
                tier: tier_label(self.config.start_tier),
                outcome: BLOCKED_OUTCOME.into(),
                candidate_commit: String::new(),
                feedback: serde_json::Value::Array(Vec::new()),
                started_at: Some(now),
                finished_at: now,
            },
        )
        .await
    }

    pub(super) async fn raise_question(
        &self,
        claim: &Claim,
        question: String,
    ) -> Result<(), EngineError> {
        self.stage(&format!("blocked: {question}"));
        self.command(claim, Fenced::RaiseSpecQuestion { question })
            .await?;
        Ok(())
    }
}
