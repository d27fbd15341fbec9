//! `product_tree_digest`: one digest over every path that can affect build, execution or
//! packaging of a commit, i.e. every path except `attestation-only` ones.
//!
//! # Canonical encoding (`protobot.product-tree/v1`)
//!
//! Entries are all non-directory entries of the commit's tree whose class under the commit's
//! own projection manifest is not `attestation-only` (unclassified, integration-only and the
//! manifest itself are included). They are sorted by raw path bytes. The digest is
//! `"sha256:" + hex(SHA-256(E))` with
//! `E = "protobot.product-tree/v1\n" ‖ for each entry: mode ‖ " " ‖ path ‖ 0x00 ‖ sha256(content)`
//! where `mode` is the six-digit octal Git mode in ASCII (`100644`, `100755`, `120000`,
//! `160000`), `path` is the raw `/`-separated path bytes and `sha256(content)` is the 32 raw
//! bytes of the SHA-256 of the blob content (for a gitlink: of the 40-character lowercase hex
//! commit ID). Content hashes rather than Git object IDs keep the digest independent of the
//! repository's hash algorithm, and nothing depends on checkout, line endings, file-system
//! case or clone.

use git2::{Oid, Repository};
use sha2::{Digest, Sha256};

use crate::{
    export::{ExportError, load_manifest},
    manifest::PathClass,
    tree::{list_files, mode},
};

/// One entry of the canonical encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestEntry {
    /// Raw path bytes.
    pub path: Vec<u8>,
    /// Git mode.
    pub mode: i32,
    /// SHA-256 of the content.
    pub content_sha256: [u8; 32],
}

/// Pure: the digest of already-selected entries (sorted here, so callers need not sort).
pub fn encode_product_tree(entries: &mut [DigestEntry]) -> String {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let mut h = Sha256::new();
    h.update(b"protobot.product-tree/v1\n");
    for entry in entries.iter() {
        h.update(format!("{:06o} ", entry.mode).as_bytes());
        h.update(&entry.path);
        h.update([0u8]);
        h.update(entry.content_sha256);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// Failures computing the digest.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// A git read failed.
    #[error("failed to {operation} while computing product_tree_digest of {commit}: {source}")]
    Git {
        /// Operation.
        operation: &'static str,
        /// Commit.
        commit: String,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// The manifest at the commit is unusable, so attestation paths are unknown.
    #[error("unable to compute product_tree_digest of {commit}: {source}")]
    Manifest {
        /// Commit.
        commit: String,
        /// Cause.
        #[source]
        source: Box<ExportError>,
    },
}

/// Computes `product_tree_digest` of `commit` (see the module docs for the encoding).
pub fn product_tree_digest(repo: &Repository, commit: Oid) -> Result<String, DigestError> {
    let git = |operation: &'static str| {
        move |source| DigestError::Git {
            operation,
            commit: commit.to_string(),
            source,
        }
    };
    let tree = repo
        .find_commit(commit)
        .and_then(|c| c.tree())
        .map_err(git("read the tree"))?;
    let files = list_files(repo, &tree).map_err(git("list the tree"))?;
    let manifest = load_manifest(repo, &files).map_err(|e| DigestError::Manifest {
        commit: commit.to_string(),
        source: Box::new(e),
    })?;
    let mut entries = Vec::with_capacity(files.len());
    for file in files {
        let class = file.path.as_deref().and_then(|p| manifest.classify(p));
        if class == Some(PathClass::AttestationOnly) {
            continue;
        }
        let content_sha256: [u8; 32] = if file.mode == mode::GITLINK {
            Sha256::digest(file.id.to_string().as_bytes()).into()
        } else {
            let blob = repo.find_blob(file.id).map_err(git("read a blob"))?;
            Sha256::digest(blob.content()).into()
        };
        entries.push(DigestEntry {
            path: file.path_bytes,
            mode: file.mode,
            content_sha256,
        });
    }
    Ok(encode_product_tree(&mut entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_order_independent_and_mode_sensitive() {
        let a = DigestEntry {
            path: b"a".to_vec(),
            mode: 0o100644,
            content_sha256: [1; 32],
        };
        let b = DigestEntry {
            path: b"b".to_vec(),
            mode: 0o100644,
            content_sha256: [2; 32],
        };
        let one = encode_product_tree(&mut [a.clone(), b.clone()]);
        let two = encode_product_tree(&mut [b.clone(), a.clone()]);
        assert_eq!(one, two);
        let exec = DigestEntry {
            mode: 0o100755,
            ..a
        };
        assert_ne!(one, encode_product_tree(&mut [exec, b]));
        assert!(one.starts_with("sha256:") && one.len() == 7 + 64);
    }
}
