//! Tests of the `protobot-api` crate: the generated CRDs, their schemas and the pure
//! condition rules. One test binary keeps the shared target light; each module below
//! has one purpose:
//!
//! * `drift`: the committed `crds/` equal the generated output (`make crds`).
//! * `conventions`: every CRD is namespaced, has the status subresource, printer columns,
//!   short names and the `protobot` category, and its printer columns point at real fields.
//! * `schema`: key fields exist with the types the Rust model promises.
//! * `conditions`: `set_condition` keeps or moves `lastTransitionTime` as the convention says.
//! * `leased`: the `Leased` condition computed from the lease and a passed-in `now`.
//! * `instances`: sample objects round-trip through serde and validate against the
//!   generated `openAPIV3Schema` (no field the API server would prune or reject).
//! * `history`: bounded status lists keep their newest entries.
//! * `crdgen`: file naming, determinism and `write_all` behaviour.
//! * `examples`: every manifest of `docs/examples/` is a valid object of its kind.
//! * `formats`: the CRDs carry only integer formats the API server knows.
//!
//! `util` holds the schema helpers and fixtures the modules share.

// Helpers outside `#[test]` functions are test code too; a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod conditions;
mod conventions;
mod crdgen;
mod drift;
mod examples;
mod formats;
mod history;
mod instances;
mod leased;
mod schema;
mod util;
