//! Integration tests of protobot-repo on real repositories in temp dirs.
//!
//! - `util`: fixture builders (canonical repo with tricky paths, commits, bare origin).
//! - `projection`: role projections contain exactly their allowlist and nothing of the
//!   canonical repository's objects, refs, remotes, alternates, reflogs or hooks.
//! - `bundles`: the Patch/Ownership Validator rejects a corpus of hostile bundles, each with a
//!   specific code, without touching the integration repository.
//! - `integration`: accepted bundles land on integration branches and merge into `wi/`.
//! - `landing`: digests, attestation snapshot, merge to main, push guard, crash-rerun.
//! - `seams`: the CLI entry points over files.
//! - `fuzz`: issue #16 fuzz targets (bundle validation, path folding, trailers).
//! - `hostile`: issue #16, one corpus per class of hostile worker output.
//! - `large_blobs`: issue #16, large blobs stream into a projection (loose, packed, deltified),
//!   byte for byte as in memory; damaged ones fail it and leave nothing.
//! - `remote_servers`: issue #18, fetch and guarded push over HTTPS and SSH against real
//!   servers on loopback (`support/git_servers.rs`, `scripts/git-test-servers`).
//! - `golden_scm`: replays the `approved_merge` lines of the upstream SCM golden fixture.

// Fixture helpers outside #[test] fns unwrap too: a panic there is a failed setup with a location
// (clippy.toml's allow-unwrap-in-tests covers only #[test] bodies).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bundles;
mod fuzz;
mod golden_scm;
mod hostile;
mod integration;
mod landing;
mod large_blobs;
mod projection;
mod remote_servers;
mod seams;
mod util;
