//! The operator's repository cache: a non-bare clone per project (and per
//! use) under the operator's work directory, its default branch mirrored from
//! the project's remote before every use. The Materializer reads approved
//! change sets from it; the Job Site builds in it and lands from it.

/// The clone URL of a project's `repoUrl` (`file://` stripped for local paths).
pub fn clone_url(repo_url: &str) -> String {
    crate::changeset::local_repository(repo_url)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| repo_url.to_string())
}

/// Clones the project (once) and brings its default branch up to the remote's.
pub fn mirror(url: &str, branch: &str, dir: &std::path::Path) -> Result<(), String> {
    let repo = match git2::Repository::open(dir) {
        Ok(r) => r,
        Err(_) => {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            git2::Repository::clone(url, dir).map_err(|e| e.to_string())?
        }
    };
    let remote_ref = format!("refs/heads/{branch}");
    let head = protobot_repo::land::fetch_remote_branch(&repo, "origin", &remote_ref)
        .map_err(|e| e.to_string())?;
    if let Some(head) = head {
        // The remote is the truth; the clone's default branch only mirrors it.
        repo.reference(
            &remote_ref,
            head,
            true,
            "protobot: mirror the default branch",
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}
