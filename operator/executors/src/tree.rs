//! File-tree primitives shared by the sandbox backends that hand a sandbox a
//! copy of a projection and collect its `/out`: the local run directory
//! (`rundir`) and the Kubernetes staging volume (`protobot-kube-executor`).
//!
//! - [`check_sealed`] refuses a workspace whose git metadata reaches outside it;
//! - [`copy_tree`] copies without following symlinks (special files skipped);
//! - [`scrub_git`] removes history and host state from a copied `.git`;
//! - [`collect_out`] / [`collect_into`] copy regular files and directories
//!   only, reporting what was skipped;
//! - [`remove_tree`] removes a tree the sandbox may have locked down.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt, lchown, symlink},
    path::{Path, PathBuf},
};

/// A filesystem operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to {op} {path}")]
pub struct TreeError {
    /// What was attempted.
    pub op: &'static str,
    /// On which path.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> TreeError + 'a {
    move |source| TreeError {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Owner to give the parts of a tree the sandbox writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
}

impl Owner {
    /// Gives `path` (never followed if it is a link) to this owner.
    pub fn apply(self, path: &Path) -> Result<(), TreeError> {
        lchown(path, Some(self.uid), Some(self.gid)).map_err(io_err("chown", path))
    }
}

/// Why a workspace is not a sealed projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsealed {
    /// The workspace is not a directory.
    #[error("it is not a directory")]
    NotADirectory,
    /// `.git` is a file or a link.
    #[error(".git is a file or link (a linked worktree or gitdir pointer)")]
    GitLink,
    /// `.git/objects/info/alternates` exists.
    #[error("it has objects/info/alternates")]
    Alternates,
    /// `.git/commondir` exists.
    #[error("it has a commondir pointer")]
    CommonDir,
    /// `.git/config` configures a remote.
    #[error("it has a configured remote")]
    Remote,
}

/// Why [`check_sealed`] refused a workspace.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The workspace could not be inspected (op `"inspect workspace"`).
    #[error(transparent)]
    Io(#[from] TreeError),
    /// The workspace is not sealed.
    #[error("not a sealed projection: {0}")]
    NotSealed(Unsealed),
}

/// Refuses a workspace whose git metadata would reach outside it: a `.git`
/// file (gitdir link), alternates, a commondir pointer or configured remotes
/// (ARCHITECTURE.md §4: own object database, no alternates, no remote).
pub fn check_sealed(workspace: &Path) -> Result<(), SealError> {
    let meta = fs::symlink_metadata(workspace).map_err(io_err("inspect workspace", workspace))?;
    if !meta.is_dir() {
        return Err(SealError::NotSealed(Unsealed::NotADirectory));
    }
    let git = workspace.join(".git");
    let Ok(git_meta) = fs::symlink_metadata(&git) else {
        return Ok(()); // not a repository: nothing can point outside
    };
    if !git_meta.is_dir() {
        return Err(SealError::NotSealed(Unsealed::GitLink));
    }
    for (p, why) in [
        ("objects/info/alternates", Unsealed::Alternates),
        ("commondir", Unsealed::CommonDir),
    ] {
        if fs::symlink_metadata(git.join(p)).is_ok() {
            return Err(SealError::NotSealed(why));
        }
    }
    if let Ok(config) = fs::read_to_string(git.join("config"))
        && config
            .lines()
            .any(|l| l.trim_start().to_ascii_lowercase().starts_with("[remote"))
    {
        return Err(SealError::NotSealed(Unsealed::Remote));
    }
    Ok(())
}

/// Creates a directory with exactly `mode` (fails if it exists).
pub fn mkdir(path: &Path, mode: u32) -> Result<(), TreeError> {
    fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(io_err("create directory", path))?;
    // The umask may have narrowed the mode.
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
}

/// Ensures `path` exists as a directory with exactly `mode`.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<(), TreeError> {
    fs::create_dir_all(path).map_err(io_err("create directory", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
}

/// Creates the new file `path` with `mode` and writes `body` to it.
pub fn write_new_file(path: &Path, mode: u32, body: &[u8]) -> Result<(), TreeError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io_err("create", path))?;
    f.write_all(body).map_err(io_err("write", path))
}

/// Copies `src` to `dst` (which must not exist) without following symlinks:
/// directories, regular files (with their permission bits) and symlinks are
/// copied; sockets, fifos and devices are skipped. The top directory gets
/// exactly `top_mode`; every copied entry is given to `owner`.
pub fn copy_tree(
    src: &Path,
    dst: &Path,
    top_mode: u32,
    owner: Option<Owner>,
) -> Result<(), TreeError> {
    copy_entry(src, dst, Some(top_mode), owner)
}

fn copy_entry(
    src: &Path,
    dst: &Path,
    top_mode: Option<u32>,
    owner: Option<Owner>,
) -> Result<(), TreeError> {
    let meta = fs::symlink_metadata(src).map_err(io_err("inspect", src))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        let mode = top_mode.unwrap_or(meta.permissions().mode() & 0o777 | 0o700);
        mkdir(dst, mode)?;
        for entry in fs::read_dir(src).map_err(io_err("read directory", src))? {
            let entry = entry.map_err(io_err("read directory", src))?;
            copy_entry(&entry.path(), &dst.join(entry.file_name()), None, owner)?;
        }
    } else if ft.is_file() {
        let mut from = fs::File::open(src).map_err(io_err("open", src))?;
        let mut to = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(meta.permissions().mode() & 0o777 | 0o600)
            .open(dst)
            .map_err(io_err("create", dst))?;
        io::copy(&mut from, &mut to).map_err(io_err("copy", src))?;
    } else if ft.is_symlink() {
        let target = fs::read_link(src).map_err(io_err("read link", src))?;
        symlink(&target, dst).map_err(io_err("create symlink", dst))?;
    } else {
        return Ok(());
    }
    if let Some(o) = owner {
        o.apply(dst)?;
    }
    Ok(())
}

/// Git metadata that carries history or host state and is scrubbed from a copy.
pub const GIT_SCRUB: [&str; 4] = ["logs", "FETCH_HEAD", "ORIG_HEAD", "COMMIT_EDITMSG"];

/// Removes [`GIT_SCRUB`] from the `.git` of a copied `workspace`.
pub fn scrub_git(workspace: &Path) -> Result<(), TreeError> {
    let git = workspace.join(".git");
    for name in GIT_SCRUB {
        let p = git.join(name);
        if let Ok(m) = fs::symlink_metadata(&p) {
            if m.is_dir() {
                remove_tree(&p)
            } else {
                fs::remove_file(&p)
            }
            .map_err(io_err("scrub git metadata", &p))?;
        }
    }
    Ok(())
}

/// Copies a sandbox's `/out` into the control-plane-owned `dst` (absent,
/// created 0755): regular files and directories only (new files owned by the
/// control plane, modes 0644/0755). Symlinks and special files are not
/// collected; their relative paths are returned.
pub fn collect_out(src: &Path, dst: &Path) -> Result<Vec<String>, TreeError> {
    let mut skipped = Vec::new();
    mkdir(dst, 0o755)?;
    collect_into(src, dst, Path::new(""), &mut skipped)?;
    Ok(skipped)
}

/// The body of [`collect_out`]: copies the entries of directory `src` into the
/// existing `dst`, pushing the paths (relative, under `rel`) of what was
/// skipped onto `skipped`. A link is never followed.
pub fn collect_into(
    src: &Path,
    dst: &Path,
    rel: &Path,
    skipped: &mut Vec<String>,
) -> Result<(), TreeError> {
    for entry in fs::read_dir(src).map_err(io_err("read /out directory", src))? {
        let entry = entry.map_err(io_err("read /out directory", src))?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let rel = rel.join(entry.file_name());
        let meta = fs::symlink_metadata(&from).map_err(io_err("inspect", &from))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            mkdir(&to, 0o755)?;
            collect_into(&from, &to, &rel, skipped)?;
        } else if ft.is_file() {
            // The sandbox has ended before collection, so nothing can swap
            // this file for a link between the check above and the open.
            let mut r = fs::File::open(&from).map_err(io_err("open", &from))?;
            let mut w = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&to)
                .map_err(io_err("create", &to))?;
            io::copy(&mut r, &mut w).map_err(io_err("copy", &from))?;
        } else {
            skipped.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// Removes a tree even when the sandbox left directories without write or
/// search permission. Absent is fine.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            open_up(path);
            fs::remove_dir_all(path)
        }
    }
}

fn open_up(path: &Path) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o700));
        if let Ok(entries) = fs::read_dir(path) {
            for e in entries.flatten() {
                open_up(&e.path());
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn sealed_repo(dir: &Path) -> PathBuf {
        let ws = dir.join("ws");
        fs::create_dir_all(ws.join(".git/objects/info")).unwrap();
        fs::write(ws.join(".git/config"), "[core]\n\tbare = false\n").unwrap();
        ws
    }

    fn refusal(ws: &Path) -> Option<Unsealed> {
        match check_sealed(ws) {
            Ok(()) => None,
            Err(SealError::NotSealed(why)) => Some(why),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    #[test]
    fn check_sealed_accepts_a_sealed_repo_and_a_plain_directory() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(refusal(&sealed_repo(tmp.path())), None);
        let plain = tmp.path().join("plain");
        fs::create_dir(&plain).unwrap();
        assert_eq!(refusal(&plain), None);
    }

    #[test]
    fn check_sealed_refuses_each_way_out() {
        let tmp = tempfile::tempdir().unwrap();

        let file = tmp.path().join("file");
        fs::write(&file, "x").unwrap();
        assert_eq!(refusal(&file), Some(Unsealed::NotADirectory));
        let link = tmp.path().join("link");
        symlink(sealed_repo(tmp.path()), &link).unwrap();
        assert_eq!(refusal(&link), Some(Unsealed::NotADirectory));

        let worktree = tmp.path().join("worktree");
        fs::create_dir(&worktree).unwrap();
        fs::write(worktree.join(".git"), "gitdir: /elsewhere/.git\n").unwrap();
        assert_eq!(refusal(&worktree), Some(Unsealed::GitLink));

        let cases: [(&str, &str, &str, Unsealed); 3] = [
            (
                "alt",
                "objects/info/alternates",
                "/elsewhere\n",
                Unsealed::Alternates,
            ),
            ("common", "commondir", "../..\n", Unsealed::CommonDir),
            (
                "remote",
                "config",
                "[core]\n  [Remote \"origin\"]\n\turl = x\n",
                Unsealed::Remote,
            ),
        ];
        for (name, file, body, why) in cases {
            let ws = sealed_repo(&tmp.path().join(name));
            fs::write(ws.join(".git").join(file), body).unwrap();
            assert_eq!(refusal(&ws), Some(why), "{name}");
        }

        let missing = tmp.path().join("missing");
        match check_sealed(&missing) {
            Err(SealError::Io(e)) => {
                assert_eq!(e.op, "inspect workspace");
                assert_eq!(e.path, missing);
            }
            other => panic!("expected an I/O error, got {other:?}"),
        }
    }

    #[test]
    fn copy_tree_keeps_links_as_links_skips_special_files_and_sets_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o500)).unwrap();
        fs::write(src.join("run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(src.join("run.sh"), fs::Permissions::from_mode(0o400)).unwrap();
        symlink("/etc/passwd", src.join("passwd")).unwrap();
        let _socket = UnixListener::bind(src.join("sock")).unwrap();

        for top in [0o700, 0o755] {
            let dst = tmp.path().join(format!("dst-{top:o}"));
            copy_tree(&src, &dst, top, None).unwrap();
            assert_eq!(mode(&dst), top);
            assert_eq!(mode(&dst.join("sub")), 0o700, "owner rwx added");
            assert_eq!(mode(&dst.join("run.sh")), 0o600, "owner rw added");
            assert_eq!(
                fs::read_link(dst.join("passwd")).unwrap(),
                Path::new("/etc/passwd")
            );
            assert!(
                fs::symlink_metadata(dst.join("sock")).is_err(),
                "socket skipped"
            );
        }
        fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn collect_does_not_follow_links_and_skips_special_files() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret"), "secret").unwrap();
        let out = tmp.path().join("out");
        fs::create_dir_all(out.join("sub")).unwrap();
        fs::write(out.join("sub/x"), "x").unwrap();
        symlink(&outside, out.join("dirlink")).unwrap();
        symlink(outside.join("secret"), out.join("sub/filelink")).unwrap();
        let _socket = UnixListener::bind(out.join("sock")).unwrap();

        let dst = tmp.path().join("collected");
        let mut skipped = collect_out(&out, &dst).unwrap();
        skipped.sort();
        assert_eq!(skipped, ["dirlink", "sock", "sub/filelink"]);
        assert_eq!(fs::read_to_string(dst.join("sub/x")).unwrap(), "x");
        assert_eq!(mode(&dst), 0o755);
        assert_eq!(mode(&dst.join("sub")), 0o755);
        assert_eq!(mode(&dst.join("sub/x")), 0o644);
        for gone in ["dirlink", "sock", "sub/filelink"] {
            assert!(fs::symlink_metadata(dst.join(gone)).is_err(), "{gone}");
        }
    }

    #[test]
    fn remove_tree_opens_up_locked_directories_and_accepts_absence() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/b/f"), "f").unwrap();
        fs::set_permissions(root.join("a/b"), fs::Permissions::from_mode(0o500)).unwrap();
        fs::set_permissions(root.join("a"), fs::Permissions::from_mode(0o000)).unwrap();
        remove_tree(&root).unwrap();
        assert!(fs::symlink_metadata(&root).is_err());
        remove_tree(&root).unwrap();
    }
}
