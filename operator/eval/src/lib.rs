//! Evaluability (issue 21): every Job Site run writes result records valid
//! against the evaluation corpus's result schema (`result.schema.json`, v1,
//! `tests/fixtures/upstream/eval-corpus/schema/`), attributed by stage, plus a
//! trace bundle from which the records replay offline.
//!
//! Pipeline, all pure (no clock, no I/O; the caller passes `recorded_at`, the
//! run id and the evidence it read from disk):
//! - [`fixture`]: the corpus fixture a run is evaluated against (parsed from
//!   its bytes; its digest is the sha256 of those bytes);
//! - [`evidence`]: what a run produced, as typed values ([`evidence::JobSiteRun`],
//!   serialised as the trace bundle);
//! - [`records`]: one record per Job Site stage (Worker A, Worker B, triage,
//!   inspection, merge) and one for the whole Job Site stage;
//! - [`semantics`]: the corpus's rules beyond the schema (pass flags against
//!   critical failures, count sums, stage against projection).
//!
//! [`schema`] holds the record types, field for field as the schema names them.

pub mod evidence;
pub mod fixture;
pub mod records;
pub mod schema;
pub mod semantics;
