//! git machinery of the Job Site: projections, patch bundles, integration, digests, merges.
//!
//! Kube-free. The pure core (what a role sees, which tests are valid, whether a bundle is
//! acceptable, how digests and trailers are encoded) is separate from the thin git2 shell:
//!
//! | Step | Pure | git2 edge |
//! | --- | --- | --- |
//! | classify paths | [`manifest`], [`path`], [`role`] | |
//! | select tests | [`catalog`] | |
//! | export a role projection | [`plan`], [`pack::encode_entry`] | [`export`], [`tree`], [`source_odb`] |
//! | collect and validate a Worker's patch | [`validate`] | [`bundle`] |
//! | apply and merge into `wi/` | [`trailers`] | [`integrate`] |
//! | product digest | [`digest::encode_product_tree`] | [`digest::product_tree_digest`] |
//! | attest, merge to main, push, verify, look up | [`trailers`] | [`land`] |
//! | authenticate to the remote, check its host key or certificate | [`remote::RemoteUrl`], [`remote::Credentials`], [`remote::KnownHosts`] | [`remote::Session`] |
//!
//! CLI seams live in [`seams`]: `protobot projection export` → [`seams::projection_export`],
//! `protobot patch check` → [`seams::patch_check`].
//!
//! Typical cycle: [`export::export_projection`] per role → sandbox → [`bundle::collect_bundle`]
//! → [`validate::accept_bundle`] → [`integrate::apply_bundle`] →
//! [`integrate::merge_into_work_item`]; after inspection [`land::commit_attestation`] →
//! [`land::land_work_item`]. The reconciler uses [`land::find_merge_by_trailer`] and
//! [`land::approved_merge`].

pub mod bundle;
pub mod catalog;
pub mod digest;
pub mod export;
pub mod integrate;
pub mod land;
pub mod loose;
pub mod manifest;
pub mod pack;
pub mod path;
pub mod plan;
pub mod remote;
pub mod role;
pub mod seams;
pub mod source_odb;
pub mod timeouts;
pub mod trailers;
pub mod tree;
pub mod validate;
