//! Entry points for the `protobot` CLI: one call per command, each returning a serialisable
//! report, so the binary only parses flags and prints.
//!
//! - `protobot projection export --role A|B|inspector --at <commit> <repo> <dest>` →
//!   [`projection_export`] (writes `<dest>` and the control-plane record `<dest>.projection.json`).
//! - `protobot patch check --role A|B <bundle> --projection <dir>` → [`patch_check`]
//!   (reads the record beside `<dir>`; prints every violation; exit non-zero unless accepted).

use std::path::{Path, PathBuf};

use crate::{
    bundle::{BundleError, PatchBundle},
    catalog::ChangeScope,
    export::{
        ExportError, ExportReport, ExportRequest, ProjectionRecord, export_projection,
        record_path_for,
    },
    role::Role,
    validate::{Limits, ValidationReport, check_bundle},
};

/// `protobot projection export`.
pub fn projection_export(
    repo: &Path,
    at: &str,
    role: Role,
    dest: &Path,
    scope: ChangeScope,
) -> Result<ExportReport, ExportError> {
    export_projection(&ExportRequest {
        source_repo: repo.to_owned(),
        at: at.to_owned(),
        role,
        dest: dest.to_owned(),
        scope,
    })
}

/// Failures of `protobot patch check` before any rule could be evaluated.
#[derive(Debug, thiserror::Error)]
pub enum PatchCheckError {
    /// The bundle file could not be read.
    #[error("failed to read bundle {path}: {source}")]
    ReadBundle {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The bundle file is larger than any bundle within the limits can be.
    #[error(
        "unable to check bundle {path}: it is over {limit} bytes, more than a bundle within the limits can hold; the Worker must shrink its patch"
    )]
    TooLarge {
        /// Path.
        path: PathBuf,
        /// Bytes read at most.
        limit: u64,
    },
    /// The bundle file is not a PatchBundle document.
    #[error("failed to decode bundle {path}: {source}")]
    DecodeBundle {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: BundleError,
    },
    /// The projection record could not be read.
    #[error(transparent)]
    Record(#[from] ExportError),
    /// `--role` differs from the role the projection was exported for.
    #[error(
        "unable to check the bundle: --role {requested} but the projection at {projection} was exported for {recorded}"
    )]
    RoleMismatch {
        /// `--role`.
        requested: Role,
        /// Recorded role.
        recorded: Role,
        /// Projection directory.
        projection: PathBuf,
    },
}

/// The largest bundle file worth reading: the content limit twice (hex) plus 16 MiB for
/// paths, messages and JSON.
pub fn max_bundle_file_bytes(limits: &Limits) -> u64 {
    limits
        .max_total_bytes
        .saturating_mul(2)
        .saturating_add(16 << 20)
}

/// `protobot patch check`: validates a bundle file against the projection it came from.
pub fn patch_check(
    bundle_path: &Path,
    projection_dir: &Path,
    role: Role,
    limits: &Limits,
) -> Result<ValidationReport, PatchCheckError> {
    let limit = max_bundle_file_bytes(limits);
    let mut bytes = Vec::new();
    std::fs::File::open(bundle_path)
        .and_then(|f| {
            std::io::Read::read_to_end(&mut std::io::Read::take(f, limit + 1), &mut bytes)
        })
        .map_err(|source| PatchCheckError::ReadBundle {
            path: bundle_path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(PatchCheckError::TooLarge {
            path: bundle_path.to_owned(),
            limit,
        });
    }
    let bundle =
        PatchBundle::from_json(&bytes).map_err(|source| PatchCheckError::DecodeBundle {
            path: bundle_path.to_owned(),
            source,
        })?;
    let record = ProjectionRecord::read(&record_path_for(projection_dir))?;
    if record.role != role {
        return Err(PatchCheckError::RoleMismatch {
            requested: role,
            recorded: record.role,
            projection: projection_dir.to_owned(),
        });
    }
    Ok(check_bundle(&bundle, &record, limits))
}
