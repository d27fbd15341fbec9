//! `protobot crd`: writes the CRD files of `protobot_api::crdgen` into a directory (what
//! `make crds` runs) or prints them all as one multi-document YAML stream.

use std::{
    io::{self, Write},
    path::PathBuf,
};

use clap::Subcommand;
use protobot_api::crdgen;

/// The `crd` subcommands.
#[derive(Debug, Subcommand)]
pub enum CrdCommand {
    /// Write one YAML file per CRD into DIR (created if missing) and print the written paths.
    Write {
        /// Output directory, e.g. `crds`.
        dir: PathBuf,
    },
    /// Print every CRD to stdout as one multi-document YAML stream.
    Print,
}

/// Failure of a `crd` subcommand.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// `crd write` failed.
    #[error("failed to write the CRDs into {}", dir.display())]
    Write {
        /// The output directory.
        dir: PathBuf,
        /// What failed.
        #[source]
        source: crdgen::Error,
    },
    /// `crd print` could not render the CRDs.
    #[error("failed to render the CRDs")]
    Render {
        /// What failed.
        #[source]
        source: crdgen::Error,
    },
    /// The output could not be written.
    #[error("failed to write to stdout")]
    Output {
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Runs one `crd` subcommand, writing its normal output to `out`.
pub fn run(command: CrdCommand, out: &mut impl Write) -> Result<(), CrdError> {
    match command {
        CrdCommand::Write { dir } => {
            let written = crdgen::write_all(&dir).map_err(|source| CrdError::Write {
                dir: dir.clone(),
                source,
            })?;
            for path in written {
                writeln!(out, "{}", path.display())
                    .map_err(|source| CrdError::Output { source })?;
            }
        }
        CrdCommand::Print => {
            let yaml =
                crdgen::render_multi_document().map_err(|source| CrdError::Render { source })?;
            out.write_all(yaml.as_bytes())
                .map_err(|source| CrdError::Output { source })?;
        }
    }
    out.flush().map_err(|source| CrdError::Output { source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_prints_one_path_per_written_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        run(
            CrdCommand::Write {
                dir: dir.path().to_path_buf(),
            },
            &mut out,
        )
        .unwrap();

        let printed = String::from_utf8(out).unwrap();
        let expected: Vec<String> = crdgen::render_all()
            .unwrap()
            .iter()
            .map(|r| dir.path().join(&r.file_name).display().to_string())
            .collect();
        assert_eq!(printed.lines().collect::<Vec<_>>(), expected);
        for path in &expected {
            assert!(
                std::path::Path::new(path).is_file(),
                "{path} was not written"
            );
        }
    }

    #[test]
    fn print_emits_every_crd_as_its_own_document() {
        let mut out = Vec::new();
        run(CrdCommand::Print, &mut out).unwrap();

        let printed = String::from_utf8(out).unwrap();
        let kinds = crdgen::all_crds().len();
        assert_eq!(
            printed.matches("\n---\n").count() + 1,
            kinds,
            "one document per CRD"
        );
        assert!(printed.starts_with("---\n"));
        assert!(printed.contains("kind: BuildWorkItem"));
    }

    #[test]
    fn write_into_a_file_path_names_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "x").unwrap();
        let error = run(CrdCommand::Write { dir: file.clone() }, &mut Vec::new()).unwrap_err();
        assert!(
            error.to_string().contains(&file.display().to_string()),
            "{error}"
        );
    }
}
