//! Flattening a Git tree into its file entries (the git2 edge shared by export, digests and
//! bundle collection).
//!
//! Paths are kept as raw bytes as well as UTF-8 text so that no caller silently drops or
//! rewrites a name it cannot decode.

use git2::{ObjectType, Oid, Repository, Tree};

/// Git file modes the Job Site distinguishes.
pub mod mode {
    /// Regular file.
    pub const FILE: i32 = 0o100644;
    /// Executable file.
    pub const EXECUTABLE: i32 = 0o100755;
    /// Symbolic link.
    pub const SYMLINK: i32 = 0o120000;
    /// Submodule (gitlink).
    pub const GITLINK: i32 = 0o160000;
    /// Directory.
    pub const TREE: i32 = 0o040000;
}

/// One non-directory entry of a flattened tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeFile {
    /// Full path, raw bytes, `/`-separated.
    pub path_bytes: Vec<u8>,
    /// The path as text, when it is valid UTF-8.
    pub path: Option<String>,
    /// Raw Git mode.
    pub mode: i32,
    /// Blob (or gitlink commit) ID.
    pub id: Oid,
}

/// Lists every non-directory entry under `tree`, sorted by path bytes.
pub fn list_files(repo: &Repository, tree: &Tree<'_>) -> Result<Vec<TreeFile>, git2::Error> {
    let mut out = Vec::new();
    walk(repo, tree, &mut Vec::new(), &mut out)?;
    out.sort_by(|a, b| a.path_bytes.cmp(&b.path_bytes));
    Ok(out)
}

fn walk(
    repo: &Repository,
    tree: &Tree<'_>,
    prefix: &mut Vec<u8>,
    out: &mut Vec<TreeFile>,
) -> Result<(), git2::Error> {
    for entry in tree.iter() {
        let mark = prefix.len();
        if !prefix.is_empty() {
            prefix.push(b'/');
        }
        prefix.extend_from_slice(entry.name_bytes());
        if entry.kind() == Some(ObjectType::Tree) {
            let sub = repo.find_tree(entry.id())?;
            walk(repo, &sub, prefix, out)?;
        } else {
            out.push(TreeFile {
                path_bytes: prefix.clone(),
                path: String::from_utf8(prefix.clone()).ok(),
                mode: entry.filemode_raw(),
                id: entry.id(),
            });
        }
        prefix.truncate(mark);
    }
    Ok(())
}
