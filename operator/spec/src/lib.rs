//! The governed specification store and the `ears-manager` CLI
//! (contracts/spec-store.md).
//!
//! Functional core: [`ids`], [`ears`], [`rules`], [`yaml`], [`model`],
//! [`digest`], [`projection`], [`snapshot`], [`validate`], [`graph`],
//! [`impact`] and [`compare`] are pure functions over in-memory records.
//! Thin shell: [`fsio`] (working tree, atomic transactions) and [`git`]
//! (libgit2) fill a [`vfs::Vfs`] and apply writes; [`cli`] wires commands.

pub mod cli;
pub mod compare;
pub mod diag;
pub mod digest;
pub mod ears;
pub mod fsio;
pub mod git;
pub mod graph;
pub mod ids;
pub mod impact;
pub mod model;
pub mod node;
pub mod outcome;
pub mod projection;
pub mod rules;
pub mod snapshot;
pub mod validate;
pub mod vfs;
pub mod yaml;
