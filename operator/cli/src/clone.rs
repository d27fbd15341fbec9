//! The Job Site's own clone of a project: `protobot run` (and the demo) never
//! build in the user's working clone.
//!
//! The engine creates `int/` and `wi/` branches and fast-forwards the default
//! branch after landing; done in the user's clone, that moved their checked-out
//! `main` without touching the work tree (every merged file then showed as a
//! staged deletion) and filled their branch namespace. Instead the Job Site
//! works in a private, non-checked-out clone next to its work store whose
//! `origin` is the user's `origin`: it fetches the default branch from there,
//! builds, and lands on `origin` exactly as before. Afterwards only the user's
//! remote-tracking ref (`origin/<branch>`) is updated, as `git fetch` would, so
//! `git status` stays clean and `git pull --ff-only` brings the merge in.
//!
//! Pipeline: [`origin_url`] (pure: resolve a local path against the clone) →
//! [`prepare`] (init or reuse, point `origin`, fetch, set the default branch)
//! → build → [`sync_tracking_ref`].

use std::path::{Path, PathBuf};

use git2::{Repository, RepositoryInitOptions};

/// The branch the private clone's `HEAD` names: it is never created, so
/// nothing is ever checked out there and moving `main` cannot leave a stale
/// work tree behind.
const PRIVATE_HEAD: &str = "protobot-private-head";

/// Why the private clone could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    /// The user's repository cannot be opened.
    #[error(
        "unable to open the repository {path}: {source}; pass --repo a working clone of your project"
    )]
    Open {
        path: PathBuf,
        #[source]
        source: git2::Error,
    },
    /// The user's clone has no `origin`.
    #[error(
        "the repository {path} has no `origin` remote: protobot lands the merge on origin; add one with `git -C {path} remote add origin URL`"
    )]
    NoOrigin { path: PathBuf },
    /// `origin`'s URL carries credentials, which the Job Site's clone would write to disk.
    #[error(
        "the repository {path} has an origin URL that carries credentials; the Job Site's clone would store them on disk: use a credential helper or an SSH key instead (`git -C {path} remote set-url origin URL-WITHOUT-CREDENTIALS`)"
    )]
    CredentialsInUrl {
        path: PathBuf,
        #[source]
        source: protobot_repo::remote::UrlError,
    },
    /// `origin` has no default branch.
    #[error("origin ({url}) has no branch {branch}: push it first (`git push origin {branch}`)")]
    NoBranch { url: String, branch: String },
    /// A git operation on the private clone failed.
    #[error("failed to {operation} in the Job Site's clone {path}: {source}")]
    Git {
        operation: &'static str,
        path: PathBuf,
        #[source]
        source: git2::Error,
    },
}

/// The URL the private clone uses for `origin`: a local path is resolved
/// against the user's clone (`base`), anything with a scheme or `host:path` is
/// kept as written.
pub fn origin_url(url: &str, base: &Path) -> String {
    let has_scheme = url.contains("://");
    let scp_like = !url.starts_with('/')
        && !url.starts_with('.')
        && url
            .split_once(':')
            .is_some_and(|(host, _)| !host.is_empty() && !host.contains('/'));
    if has_scheme || scp_like {
        return url.to_owned();
    }
    let path = Path::new(url);
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    joined
        .canonicalize()
        .unwrap_or(joined)
        .to_string_lossy()
        .into_owned()
}

/// What [`prepare`] set up.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The private clone's directory (its work tree stays empty).
    pub path: PathBuf,
    /// `origin`'s default branch, as fetched.
    pub origin_head: git2::Oid,
    /// The user's local default branch, when it exists and differs from
    /// `origin`'s (unpushed or stale work: worth saying when a change set is
    /// not found).
    pub local_differs: bool,
}

/// Creates (or reuses) the private clone at `dest` for the user's clone
/// `user`, points its `origin` at theirs, fetches every branch and sets the
/// private `refs/heads/<branch>` to `origin`'s.
pub fn prepare(user: &Path, dest: &Path, branch: &str) -> Result<Prepared, CloneError> {
    let user_repo = Repository::open(user).map_err(|source| CloneError::Open {
        path: user.to_path_buf(),
        source,
    })?;
    let base = user_repo
        .workdir()
        .unwrap_or_else(|| user_repo.path())
        .to_path_buf();
    let raw = user_repo
        .find_remote("origin")
        .ok()
        .and_then(|r| r.url().ok().map(str::to_owned))
        .ok_or_else(|| CloneError::NoOrigin {
            path: user.to_path_buf(),
        })?;
    if let Err(source @ protobot_repo::remote::UrlError::CredentialsInUrl { .. }) =
        protobot_repo::remote::RemoteUrl::parse(&raw)
    {
        return Err(CloneError::CredentialsInUrl {
            path: user.to_path_buf(),
            source,
        });
    }
    let url = origin_url(&raw, &base);
    let git = |operation: &'static str| {
        let path = dest.to_path_buf();
        move |source| CloneError::Git {
            operation,
            path,
            source,
        }
    };
    let repo = if dest.join(".git").exists() {
        Repository::open(dest).map_err(git("open"))?
    } else {
        let mut opts = RepositoryInitOptions::new();
        opts.initial_head(PRIVATE_HEAD).mkpath(true);
        Repository::init_opts(dest, &opts).map_err(git("create"))?
    };
    match repo.find_remote("origin") {
        Ok(r) if r.url().ok() == Some(url.as_str()) => {}
        Ok(_) => repo
            .remote_set_url("origin", &url)
            .map_err(git("point origin"))?,
        Err(_) => {
            repo.remote("origin", &url).map_err(git("add origin"))?;
        }
    }
    repo.find_remote("origin")
        .and_then(|mut r| r.fetch(&["+refs/heads/*:refs/remotes/origin/*"], None, None))
        .map_err(git("fetch from origin"))?;
    let origin_head = repo
        .refname_to_id(&format!("refs/remotes/origin/{branch}"))
        .map_err(|_| CloneError::NoBranch {
            url: url.clone(),
            branch: branch.to_owned(),
        })?;
    repo.reference(
        &format!("refs/heads/{branch}"),
        origin_head,
        true,
        "protobot: the default branch as origin has it",
    )
    .map_err(git("set the default branch"))?;
    let local_differs = user_repo
        .refname_to_id(&format!("refs/heads/{branch}"))
        .is_ok_and(|local| local != origin_head);
    Ok(Prepared {
        path: dest.to_path_buf(),
        origin_head,
        local_differs,
    })
}

/// Updates the user's `refs/remotes/origin/<branch>` from `origin`, as
/// `git fetch origin <branch>` does. Never touches a local branch or the work
/// tree. Returns the new tracking head.
pub fn sync_tracking_ref(user: &Path, branch: &str) -> Result<git2::Oid, git2::Error> {
    let repo = Repository::open(user)?;
    let tracking = format!("refs/remotes/origin/{branch}");
    repo.find_remote("origin")?.fetch(
        &[format!("+refs/heads/{branch}:{tracking}").as_str()],
        None,
        None,
    )?;
    repo.refname_to_id(&tracking)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_and_scp_urls_are_kept_as_written() {
        let base = Path::new("/nowhere");
        assert_eq!(
            origin_url("https://example.com/a.git", base),
            "https://example.com/a.git"
        );
        assert_eq!(
            origin_url("git@example.com:team/a.git", base),
            "git@example.com:team/a.git"
        );
        assert_eq!(origin_url("file:///srv/a.git", base), "file:///srv/a.git");
    }

    #[test]
    fn an_origin_url_with_credentials_is_refused_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let user = tmp.path().join("user");
        let repo = Repository::init(&user).unwrap_or_else(|e| panic!("{e}"));
        repo.remote("origin", "https://me:hunter2@example.com/a.git")
            .unwrap_or_else(|e| panic!("{e}"));
        let dest = tmp.path().join("private");
        let e = prepare(&user, &dest, "main").unwrap_err();
        assert!(matches!(e, CloneError::CredentialsInUrl { .. }), "{e}");
        let text = e.to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!dest.exists(), "no clone was created");
    }

    #[test]
    fn a_relative_path_is_resolved_against_the_users_clone() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let origin = tmp.path().join("origin.git");
        std::fs::create_dir_all(&origin).unwrap_or_else(|e| panic!("{e}"));
        let work = tmp.path().join("work");
        std::fs::create_dir_all(&work).unwrap_or_else(|e| panic!("{e}"));
        let resolved = origin_url("../origin.git", &work);
        assert_eq!(
            Path::new(&resolved),
            origin.canonicalize().unwrap_or_else(|e| panic!("{e}"))
        );
        assert_eq!(
            origin_url("/abs/missing.git", &work),
            "/abs/missing.git",
            "a missing absolute path is kept (the fetch names it)"
        );
    }
}
