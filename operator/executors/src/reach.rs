//! Whether a sandbox uid can reach the scratch root, where each run's
//! `/workspace`, `/out` and `/task` are staged before `bwrap` binds them.
//!
//! With a dedicated uid per run (a root control plane), `bwrap` runs as a uid
//! that owns nothing on the host and is in no group, so it can pass through a
//! directory only when the directory gives search (`x`) permission to others.
//! A scratch root under a `0700` parent (what `mktemp -d` makes) is then out
//! of its reach, and `bwrap` fails inside the run with "Can't find source
//! path … Permission denied". [`first_blocking`] is the pure decision;
//! [`check_reachable`] reads the modes and says what to do.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

/// A directory on the way to the scratch root that the sandbox uid cannot enter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unable to stage sandbox runs under {scratch}: the sandbox's uid cannot enter {blocking} (mode {mode:04o}, no search permission for others); choose a directory outside it (e.g. under /tmp or your home with `chmod o+x`), or run `chmod o+x {blocking}`"
)]
pub struct Unreachable {
    /// The scratch root the runs need.
    pub scratch: PathBuf,
    /// The first directory that blocks it.
    pub blocking: PathBuf,
    /// That directory's permission bits.
    pub mode: u32,
}

/// The first directory of `chain` (outermost first, with its permission bits)
/// that a uid owning nothing and in no group cannot pass through.
pub fn first_blocking(chain: &[(PathBuf, u32)]) -> Option<(PathBuf, u32)> {
    chain
        .iter()
        .find(|(_, mode)| mode & 0o001 == 0)
        .map(|(path, mode)| (path.clone(), mode & 0o7777))
}

/// Checks that a per-run sandbox uid can reach `scratch`: every existing
/// directory from `/` down to it (the parts still to be made are made
/// passable by the executor). The path is made absolute first.
pub fn check_reachable(scratch: &Path) -> Result<(), Unreachable> {
    let absolute = std::path::absolute(scratch).unwrap_or_else(|_| scratch.to_path_buf());
    let chain: Vec<(PathBuf, u32)> = absolute
        .ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .filter_map(|dir| {
            let meta = std::fs::metadata(dir).ok()?;
            meta.is_dir().then(|| (dir.to_path_buf(), meta.mode()))
        })
        .collect();
    match first_blocking(&chain) {
        None => Ok(()),
        Some((blocking, mode)) => Err(Unreachable {
            scratch: absolute,
            blocking,
            mode,
        }),
    }
}

/// Whether runs get a dedicated uid, so [`check_reachable`] matters: the
/// control plane is root (see [`crate::SandboxIdentity::Auto`]).
pub fn per_run_uid_applies() -> bool {
    crate::tools::effective_uid() == Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_directory_closed_to_others_blocks_and_open_ones_do_not() {
        let chain = |modes: &[u32]| -> Vec<(PathBuf, u32)> {
            modes
                .iter()
                .enumerate()
                .map(|(i, m)| (PathBuf::from(format!("/d{i}")), *m))
                .collect()
        };
        assert_eq!(first_blocking(&chain(&[0o40755, 0o41777, 0o40711])), None);
        assert_eq!(
            first_blocking(&chain(&[0o40755, 0o40700, 0o40750])),
            Some((PathBuf::from("/d1"), 0o700))
        );
        assert_eq!(first_blocking(&[]), None);
    }

    #[test]
    fn a_scratch_root_under_a_private_directory_is_named_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let private = tmp.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        // tempdir() itself is 0700: check from a chain that starts below it.
        let err = check_reachable(&private.join("d/sandbox/scratch")).unwrap_err();
        assert!(
            err.blocking == private || err.blocking == tmp.path(),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains("chmod o+x"), "{text}");
        assert!(text.contains(&err.blocking.display().to_string()), "{text}");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            check_reachable(&private.join("x")).unwrap_err().blocking,
            private
        );
        if check_reachable(tmp.path()).is_ok() {
            assert_eq!(check_reachable(&open.join("d/sandbox/scratch")), Ok(()));
        }
    }
}
