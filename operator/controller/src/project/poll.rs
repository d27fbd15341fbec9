//! Registration by polling the default branch: the optional alternative to
//! applying a `ChangeSet` manifest per change set.
//!
//! When a Project sets `spec.pollApprovedChangeSets`, every change set whose
//! manifest a merge brought onto the default branch after the baseline gets a
//! `ChangeSet` object (owned by the Project, named after the change set);
//! from there the ChangeSet controller verifies and materializes it exactly as
//! it does an applied manifest, so both routes register the same item. The
//! baseline is `spec.pollApprovedChangeSets.sinceCommit`, or the head observed
//! when polling began (`status.pollBaseline`), so turning polling on never
//! builds a repository's history.
//!
//! Pure: [`newly_merged`], [`change_set_object`]. Git: [`merged_since`].

use std::{collections::BTreeSet, path::Path};

use kube::{Resource, ResourceExt};
use protobot_api::Project;
use protobot_spec::{git::Git, model::StoreKind, snapshot};

/// A change set merged onto the default branch, to register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    /// `CS-nnnnn`.
    pub change_set_id: String,
    /// The merge commit that brought its manifest onto the default branch.
    pub merge_commit: String,
}

/// Label on the `ChangeSet` objects the poller creates.
pub const REGISTERED_BY_LABEL: &str = "protobot.dev/registered-by";

/// The change-set IDs present at the head and not at the baseline, in order.
pub fn newly_merged(at_baseline: &BTreeSet<String>, at_head: &BTreeSet<String>) -> Vec<String> {
    at_head.difference(at_baseline).cloned().collect()
}

/// The change-set ID of a manifest file name (`cs-00001.yaml` → `CS-00001`).
pub fn change_set_id(file_name: &str) -> Option<String> {
    let digits = file_name.strip_prefix("cs-")?.strip_suffix(".yaml")?;
    (digits.len() == 5 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("CS-{digits}"))
}

/// The `ChangeSet` object registering `merged` for `project` (server-side
/// applied by the poller; owned by the Project).
pub fn change_set_object(project: &Project, merged: &Merged) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "protobot.dev/v1alpha1",
        "kind": "ChangeSet",
        "metadata": {
            "name": format!("{}-{}", project.name_any(), merged.change_set_id.to_ascii_lowercase()),
            "labels": {
                REGISTERED_BY_LABEL: "poller",
                "app.kubernetes.io/managed-by": "protobot",
            },
            "ownerReferences": project.controller_owner_ref(&()).into_iter().collect::<Vec<_>>(),
        },
        "spec": {
            "projectRef": {"name": project.name_any()},
            "changeSetId": merged.change_set_id,
            "mergeCommit": merged.merge_commit,
        },
    })
}

/// The change-set IDs whose manifests are in the change-set store at `commit`
/// (none before the spec store exists).
fn change_sets_at(
    repo: &git2::Repository,
    git: &Git,
    commit: git2::Oid,
) -> Result<BTreeSet<String>, String> {
    let Ok(snapshot) = git
        .commit_vfs(commit)
        .and_then(snapshot::open)
        .map_err(|f| f.message)
    else {
        return Ok(BTreeSet::new());
    };
    let store = snapshot.project.store_dir(StoreKind::ChangeSets);
    let tree = repo
        .find_commit(commit)
        .and_then(|c| c.tree())
        .map_err(|e| e.to_string())?;
    let Ok(entry) = tree.get_path(Path::new(store.trim_end_matches('/'))) else {
        return Ok(BTreeSet::new());
    };
    let dir = entry
        .to_object(repo)
        .and_then(|o| o.peel_to_tree())
        .map_err(|e| e.to_string())?;
    Ok(dir
        .iter()
        .filter_map(|e| e.name().ok().and_then(change_set_id))
        .collect())
}

/// Change sets merged onto `branch` between `baseline` and `head` in the
/// clone at `dir`, each with its merge commit. A manifest that did not arrive
/// by a merge is skipped (the ChangeSet controller would refuse it anyway) and
/// reported in the second list.
pub fn merged_since(
    dir: &Path,
    branch: &str,
    baseline: &str,
    head: &str,
) -> Result<(Vec<Merged>, Vec<String>), String> {
    let repo = git2::Repository::open(dir).map_err(|e| e.to_string())?;
    let git = Git::discover(dir).map_err(|f| f.message)?;
    let oid = |s: &str| git2::Oid::from_str(s).map_err(|e| format!("{s:?}: {e}"));
    let (baseline, head) = (oid(baseline)?, oid(head)?);
    if baseline != head
        && !repo
            .graph_descendant_of(head, baseline)
            .map_err(|e| e.to_string())?
    {
        return Err(format!(
            "the polling baseline {baseline} is not an ancestor of the {branch} head {head}; set spec.pollApprovedChangeSets.sinceCommit to a commit of {branch}"
        ));
    }
    let ids = newly_merged(
        &change_sets_at(&repo, &git, baseline)?,
        &change_sets_at(&repo, &git, head)?,
    );
    let store = git
        .commit_vfs(head)
        .and_then(snapshot::open)
        .map_err(|f| f.message)?
        .project
        .store_dir(StoreKind::ChangeSets);
    let tracking = format!("refs/remotes/origin/{branch}");
    let (mut merged, mut skipped) = (Vec::new(), Vec::new());
    for id in ids {
        match protobot_repo::land::approved_merge(&repo, &tracking, &id, &store) {
            Ok(approved) => merged.push(Merged {
                change_set_id: id,
                merge_commit: approved.merge_commit.to_string(),
            }),
            Err(e) => skipped.push(format!("{id}: {e}")),
        }
    }
    Ok((merged, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_change_sets_new_since_the_baseline_are_registered() {
        let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            newly_merged(
                &set(&["CS-00001"]),
                &set(&["CS-00001", "CS-00003", "CS-00002"])
            ),
            vec!["CS-00002".to_string(), "CS-00003".to_string()]
        );
        assert!(newly_merged(&set(&["CS-00001"]), &set(&["CS-00001"])).is_empty());
    }

    #[test]
    fn manifest_names_map_to_change_set_ids() {
        assert_eq!(change_set_id("cs-00042.yaml").as_deref(), Some("CS-00042"));
        for other in ["cs-42.yaml", "cs-00042.yml", "README.md", "cs-0004x.yaml"] {
            assert_eq!(change_set_id(other), None, "{other}");
        }
    }

    #[test]
    fn the_registered_object_is_owned_by_its_project() {
        let mut project: Project = serde_json::from_value(serde_json::json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": "team-a", "uid": "u-1"},
            "spec": {"repoUrl": "file:///srv/demo.git", "sandboxProfile": "kata"},
        }))
        .unwrap();
        project.metadata.uid = Some("u-1".into());
        let object = change_set_object(
            &project,
            &Merged {
                change_set_id: "CS-00007".into(),
                merge_commit: "a".repeat(40),
            },
        );
        assert_eq!(object["metadata"]["name"], "cli-sync-cs-00007");
        assert_eq!(object["spec"]["changeSetId"], "CS-00007");
        assert_eq!(object["spec"]["projectRef"]["name"], "cli-sync");
        assert_eq!(object["metadata"]["ownerReferences"][0]["kind"], "Project");
        assert_eq!(object["metadata"]["ownerReferences"][0]["uid"], "u-1");
        // It parses as a ChangeSet.
        let _: protobot_api::ChangeSet = serde_json::from_value(object).unwrap();
    }
}
