//! The governed files of a project as plain data. The shell fills a [`Vfs`]
//! from the working tree ([`crate::fsio`]) or from a commit
//! ([`crate::git`]); everything after that (decoding, validation, staging of
//! writes) is a pure function of it.

use std::collections::BTreeMap;

/// One file as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileState {
    /// Nothing at that path.
    Absent,
    /// A regular file reached without symlinks.
    Bytes(Vec<u8>),
    /// The path or one of its components is a symlink.
    Symlink,
    /// Something other than a regular file (a directory, a device …).
    NotRegular,
    /// It exists but could not be read.
    Unreadable,
}

impl FileState {
    /// The bytes when this is a readable regular file.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            FileState::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

/// One store directory as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirState {
    /// Missing: an empty store.
    Absent,
    /// A listing: entry name → state (dot-files already excluded).
    Listing(BTreeMap<String, FileState>),
    /// The directory (or a component) is a symlink.
    Symlink,
    /// It exists but is not a directory.
    NotDir,
    /// It could not be listed.
    Unreadable,
}

/// All governed files of a project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vfs {
    /// State of `.protobot` itself (a directory is `Bytes(empty)`).
    pub protobot_is_dir: bool,
    /// `.protobot/project.yaml`.
    pub project_yaml: FileState,
    /// `.protobot/projection.yaml`.
    pub projection_yaml: FileState,
    /// Store directory path → listing.
    pub stores: BTreeMap<String, DirState>,
    /// Registered artifact path → content.
    pub artifacts: BTreeMap<String, FileState>,
}

/// Path of the project configuration.
pub const PROJECT_YAML: &str = ".protobot/project.yaml";
/// Path of the projection manifest.
pub const PROJECTION_YAML: &str = ".protobot/projection.yaml";

impl Vfs {
    /// Returns a copy with `path` set to `bytes`, wherever it belongs.
    pub fn overlay(&mut self, path: &str, bytes: Vec<u8>) {
        if path == PROJECT_YAML {
            self.project_yaml = FileState::Bytes(bytes);
            return;
        }
        if path == PROJECTION_YAML {
            self.projection_yaml = FileState::Bytes(bytes);
            return;
        }
        for (dir, state) in &mut self.stores {
            if let Some(name) = path
                .strip_prefix(dir.as_str())
                .and_then(|r| r.strip_prefix('/'))
                && !name.contains('/')
            {
                if !matches!(state, DirState::Listing(_)) {
                    *state = DirState::Listing(BTreeMap::new());
                }
                if let DirState::Listing(entries) = state {
                    entries.insert(name.to_owned(), FileState::Bytes(bytes));
                }
                return;
            }
        }
        self.artifacts
            .insert(path.to_owned(), FileState::Bytes(bytes));
    }

    /// Current bytes of a governed file, if it is a readable regular file.
    pub fn get(&self, path: &str) -> FileState {
        if path == PROJECT_YAML {
            return self.project_yaml.clone();
        }
        if path == PROJECTION_YAML {
            return self.projection_yaml.clone();
        }
        for (dir, state) in &self.stores {
            if let Some(name) = path
                .strip_prefix(dir.as_str())
                .and_then(|r| r.strip_prefix('/'))
            {
                return match state {
                    DirState::Listing(entries) => {
                        entries.get(name).cloned().unwrap_or(FileState::Absent)
                    }
                    _ => FileState::Absent,
                };
            }
        }
        self.artifacts
            .get(path)
            .cloned()
            .unwrap_or(FileState::Absent)
    }
}
