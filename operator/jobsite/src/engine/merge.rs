//! Attestation and landing: the attestation snapshot and `begin-merge`, then the `merging` stage,
//! which lands by a guarded direct push or through a pull request on the forge, verifies the merge
//! on the default branch and records it; a default branch that moved sends the item back.

use std::time::Instant;

use git2::Oid;
use protobot_lifecycle::{MergeEnvelope, WorkItemRecord};
use protobot_repo::{
    digest::product_tree_digest, land::AttestationFile, land::LandError, land::commit_attestation,
    land::fetch_remote_branch, land::find_merge_by_trailer, land::land_tested_work_item,
    land::push_with_guard, land::remote_head, land::verify_remote_contains, trailers,
};
use protobot_stores::WorkStore;
use serde_json::json;

use super::{
    Engine,
    effects::{Fenced, Item},
    error::{EngineError, GitError, git_err},
    report::Progress,
};
use crate::{
    executor::Executor, landing::EscalationRequest, landing::ForgeRefusal, landing::Landing,
    landing::LandingSummary, landing::PullRequestForge, landing::PullRequestMerge, lease::Claim,
};

impl<S: WorkStore, E: Executor> Engine<S, E> {
    pub(super) async fn attest_and_begin_merge(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        run_id: &str,
        watermark: u64,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        let id = item.id;
        let head = self.head(item).await?;
        let owned_id = id.to_string();
        let (digest, already) = item
            .git(move |repo| {
                let digest = product_tree_digest(repo, head)
                    .map_err(git_err("compute the product tree digest"))?;
                // Idempotent: a resumed Job Site finds its own attestation commit at the head.
                let already = repo.find_commit(head).ok().is_some_and(|c| {
                    let found = trailers::parse(&String::from_utf8_lossy(c.message_bytes()));
                    trailers::value(&found, trailers::WORK_ITEM) == Some(owned_id.as_str())
                        && trailers::value(&found, trailers::PRODUCT_TREE_DIGEST)
                            == Some(digest.as_str())
                });
                Ok((digest, already))
            })
            .await?;
        let attested = if already {
            head.to_string()
        } else {
            let files = vec![
                AttestationFile {
                    path: format!(".protobot/attestations/{id}/findings.jsonl"),
                    content: progress.ledger.snapshot_jsonl(run_id).into_bytes(),
                },
                AttestationFile {
                    path: format!(".protobot/attestations/{id}/report.md"),
                    content: format!(
                        "# Inspection report for {id}\n\nRun `{run_id}` sealed at ledger sequence {watermark} with every finding terminal.\nProduct tree digest: `{digest}`.\n"
                    )
                    .into_bytes(),
                },
            ];
            let (wi, sealed, now) = (item.wi.clone(), digest.clone(), self.now_secs());
            let attested = item
                .git(move |repo| {
                    commit_attestation(repo, &wi, &files, &sealed, now)
                        .map_err(git_err("commit the attestation snapshot"))
                })
                .await?;
            self.boundary(id, "after:attestation")?;
            attested.commit
        };
        progress.digest = Some(digest.clone());
        let version = claim.held().map(|h| h.contract_version).unwrap_or_default();
        let envelope = MergeEnvelope {
            product_tree_digest: digest,
            inspection_run_id: run_id.to_string(),
            integration_head: attested,
            target: self.config.target_branch.clone(),
            contract_version: version + 1,
            merge_commit: String::new(),
        };
        self.stage("merging: attestation committed; merging wi/ into the default branch");
        self.command(claim, Fenced::BeginMerge(envelope)).await?;
        Ok(())
    }

    pub(super) async fn merging(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        record: &WorkItemRecord,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        let id = item.id;
        let Some(mut envelope) = record.expected_merge.clone() else {
            return Err(EngineError::Output {
                role: "work store",
                reason: format!("{id} is merging without a merge envelope"),
            });
        };
        progress.digest = Some(envelope.product_tree_digest.clone());
        // `merging` takes no renewals: `begin-merge` was the last fenced write, and
        // landing is idempotent by trailer, so a Job Site that lost the item in
        // between can only rediscover the same merge, never add a second one.
        claim.check()?;
        self.boundary(id, "before:land")?;
        if let Landing::PullRequest(forge) = item.landing {
            return Box::pin(self.land_through_pull_request(
                claim,
                item,
                envelope,
                progress,
                forge.as_ref(),
            ))
            .await;
        }
        let started = Instant::now();
        let (wi, remote, target, now) = (
            item.wi.clone(),
            self.config.remote.clone(),
            self.config.target_branch.clone(),
            self.now_secs(),
        );
        let landed = item
            .git(move |repo| Ok(land_tested_work_item(repo, &wi, &remote, &target, now)))
            .await?;
        self.trace(
            id,
            "land",
            None,
            json!({"integration_head": envelope.integration_head}),
            match &landed {
                Ok(l) => json!({"merge_commit": l.merge_commit, "pushed": l.pushed, "already_merged": l.already_merged}),
                Err(e) => json!({"error": e.category()}),
            },
            started,
        );
        match landed {
            Ok(landed) => {
                self.boundary(id, "after:land")?;
                envelope.merge_commit = landed.merge_commit.clone();
                self.command(claim, Fenced::RecordMerge(envelope)).await?;
                progress.merge_commit = Some(landed.merge_commit);
                self.stage("completed: merged, verified on the default branch and recorded");
                Ok(())
            }
            Err(LandError::Untested { .. } | LandError::RemoteMoved { .. }) => {
                // The default branch moved past the tested candidate: back to building
                // (a fresh fence), where the passed cycle is reused and revalidated.
                self.stage("merging: the default branch moved; revalidating before landing");
                self.command(claim, Fenced::MergeConflict).await?;
                Ok(())
            }
            Err(e @ LandError::NotOnRemote { .. }) => {
                // Pushed, but the remote does not contain the merge: never record it.
                tracing::error!(work_item = id, error = %e, "merge verification failed");
                Err(EngineError::MergeNotVerified {
                    reason: e.to_string(),
                })
            }
            Err(e) => Err(git_err("land the work item")(e)),
        }
    }

    /// Lands through a pull request ([`Landing::PullRequest`]): the same preconditions as a
    /// direct push (the candidate contains the default head, a merge already there by its
    /// trailer is recorded, not repeated), then push `wi/…` without force, let the forge open
    /// or reuse the pull request and merge it with the tested head as the guard, and verify
    /// by fetching that the default branch holds a merge of exactly the tested head.
    pub(super) async fn land_through_pull_request(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        mut envelope: MergeEnvelope,
        progress: &mut Progress,
        forge: &dyn PullRequestForge,
    ) -> Result<(), EngineError> {
        let id = item.id;
        let remote = self.config.remote.as_str();
        let target_ref = format!("refs/heads/{}", self.config.target_branch);
        let started = Instant::now();
        let (remote_main, existing) = {
            let (remote, target_ref, id) = (remote.to_string(), target_ref.clone(), id.to_string());
            item.git(move |repo| {
                let main = fetch_remote_branch(repo, &remote, &target_ref)
                    .map_err(git_err("fetch the default branch"))?
                    .ok_or_else(|| {
                        git_err("fetch the default branch")(GitError::NoRemoteBranch {
                            remote: remote.clone(),
                            reference: target_ref.clone(),
                        })
                    })?;
                let existing = find_merge_by_trailer(repo, main, &id)
                    .map_err(git_err("look for an existing merge of the work item"))?;
                Ok((main, existing))
            })
            .await?
        };
        if let Some(existing) = existing {
            self.stage("merging: the default branch already holds this work item's merge");
            return self
                .record_landed(claim, &mut envelope, existing.to_string(), progress)
                .await;
        }
        let head = self.head(item).await?;
        let contains_main = head == remote_main
            || item
                .git(move |repo| {
                    repo.graph_descendant_of(head, remote_main)
                        .map_err(git_err("compare the candidate with the default branch"))
                })
                .await?;
        if !contains_main {
            return self
                .revalidate(claim, "the default branch moved past the tested candidate")
                .await;
        }
        let wi_ref = item.wi.branch_ref();
        {
            let (remote, wi_ref) = (remote.to_string(), wi_ref.clone());
            item.git(move |repo| {
                let pushed = remote_head(repo, &remote, &wi_ref)
                    .map_err(git_err("read the remote work-item branch"))?;
                if pushed != Some(head) {
                    push_with_guard(repo, &remote, &wi_ref, &wi_ref, pushed)
                        .map_err(git_err("push the work-item branch"))?;
                }
                Ok(())
            })
            .await?;
        }
        self.boundary(id, "after:push-work-item-branch")?;
        let request = PullRequestMerge {
            work_item_id: id.to_string(),
            head_branch: wi_ref.trim_start_matches("refs/heads/").to_string(),
            base_branch: self.config.target_branch.clone(),
            tested_head: head.to_string(),
            merge_message: trailers::compose(
                &format!(
                    "Merge {} into {}",
                    wi_ref.trim_start_matches("refs/heads/"),
                    self.config.target_branch
                ),
                None,
                &[(trailers::WORK_ITEM, id.to_string())],
            ),
            summary: LandingSummary {
                // `<project>/<CS-NNNNN>@<merge>` for a change set (a bug has another key).
                change_set_id: item
                    .contract
                    .materialization_key
                    .split(['/', '@'])
                    .nth(1)
                    .filter(|c| c.starts_with("CS-"))
                    .map(str::to_string),
                product_tree_digest: envelope.product_tree_digest.clone(),
                inspection_run_id: envelope.inspection_run_id.clone(),
                findings: progress.inspections.iter().map(|r| r.findings).sum(),
                cycles: progress.cycles.len(),
                evidence: vec![
                    (
                        "findings snapshot".to_string(),
                        format!(".protobot/attestations/{id}/findings.jsonl"),
                    ),
                    (
                        "inspection report".to_string(),
                        format!(".protobot/attestations/{id}/report.md"),
                    ),
                ],
            },
        };
        let answer = forge.merge(&request).await;
        self.trace(
            id,
            "land",
            None,
            json!({"integration_head": envelope.integration_head, "tested_head": request.tested_head, "via": "pull-request"}),
            match &answer {
                Ok(m) => json!({"merge_commit": m.merge_commit, "pull_request": m.pull_request}),
                Err(r) => json!({"refused": r.category()}),
            },
            started,
        );
        match answer {
            Ok(merged) => {
                self.boundary(id, "after:land")?;
                let verified = match Oid::from_str(&merged.merge_commit).ok() {
                    Some(merge) => {
                        self.verify_pull_request_merge(item, &target_ref, merge, head)
                            .await?
                    }
                    None => false,
                };
                if !verified {
                    tracing::error!(work_item = id, merge_commit = %merged.merge_commit, "pull-request merge not verified");
                    return Err(EngineError::MergeNotVerified {
                        reason: format!(
                            "the forge reported pull request #{} merged as {}, but {remote}/{} does not contain a merge of the tested head {head}",
                            merged.pull_request, merged.merge_commit, self.config.target_branch
                        ),
                    });
                }
                self.record_landed(claim, &mut envelope, merged.merge_commit, progress)
                    .await
            }
            Err(ForgeRefusal::HeadMoved { reason } | ForgeRefusal::Conflict { reason }) => {
                self.revalidate(claim, &reason).await
            }
            Err(refusal @ ForgeRefusal::Blocked { .. }) => {
                let escalation = EscalationRequest {
                    work_item_id: id.to_string(),
                    reason: refusal.to_string(),
                    decision: "Make the candidate mergeable under the default branch's rules (fix the failing check, or satisfy or adjust the protection rule), then run `protobot retry`; or `protobot abandon` the work item.".to_string(),
                };
                if let Err(error) = forge.escalate(&escalation).await {
                    // The refusal stands either way; the issue is the visible copy of it.
                    tracing::warn!(work_item = id, %error, "failed to open the escalation issue");
                }
                self.stage(&format!("merging: refused by the forge: {refusal}"));
                Err(EngineError::MergeRefused {
                    work_item_id: id.to_string(),
                    refusal,
                })
            }
            Err(refusal) => Err(EngineError::MergeRefused {
                work_item_id: id.to_string(),
                refusal,
            }),
        }
    }

    /// Whether `target_ref`, fetched now, contains `merge` and `merge` is a merge of the
    /// tested `head` (its second parent): the forge's "merged" is never trusted alone.
    pub(super) async fn verify_pull_request_merge(
        &self,
        item: &Item<'_>,
        target_ref: &str,
        merge: Oid,
        head: Oid,
    ) -> Result<bool, EngineError> {
        let (remote, target_ref) = (self.config.remote.clone(), target_ref.to_string());
        item.git(move |repo| {
            let contains = verify_remote_contains(repo, &remote, &target_ref, merge)
                .map_err(git_err("verify the default branch"))?;
            let merges_head = repo
                .find_commit(merge)
                .ok()
                .is_some_and(|c| c.parent_count() == 2 && c.parent_id(1).ok() == Some(head));
            Ok(contains && merges_head)
        })
        .await
    }

    /// Back to building (a fresh fence): the passed cycle is reused and revalidated against
    /// the new default head, then the item lands again.
    pub(super) async fn revalidate(&self, claim: &Claim, why: &str) -> Result<(), EngineError> {
        self.stage(&format!("merging: {why}; revalidating before landing"));
        self.command(claim, Fenced::MergeConflict).await?;
        Ok(())
    }

    pub(super) async fn record_landed(
        &self,
        claim: &Claim,
        envelope: &mut MergeEnvelope,
        merge_commit: String,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        envelope.merge_commit = merge_commit.clone();
        self.command(claim, Fenced::RecordMerge(envelope.clone()))
            .await?;
        progress.merge_commit = Some(merge_commit);
        self.stage("completed: merged, verified on the default branch and recorded");
        Ok(())
    }
}
