//! GitHub, or Gitea/Forgejo, as the forge of a protobot Project.
//!
//! The pure core ([`core`]) decides: whether a pull request is an approved merge of a change
//! set under the project's review mode, what the merge API's answer means for the lifecycle,
//! what the pull request, the escalation issue and the commit statuses say (sanitized), and
//! how long GitHub's rate limits make us wait. The shell ([`client`], over octocrab) sends the
//! requests and hands status, headers and body back to the core; [`auth`] holds the token or
//! mints GitHub App installation tokens in memory; [`metrics`] counts every API call;
//! [`landing`] plugs it all into the Job Site engine's `merging` stage
//! (`protobot_jobsite::landing::PullRequestForge`).
//!
//! [`gitea`] is the second forge: Gitea's REST API on the same seam, its answers decided by
//! [`core::gitea`].
//!
//! See docs/forge-github.md and docs/forge-gitea.md for configuration, permissions and limits.

pub mod auth;
pub mod client;
pub mod core;
pub mod gitea;
pub mod landing;
pub mod metrics;

pub use client::{ForgeError, GithubClient, GithubSettings, Operation, PullState};
pub use gitea::{GiteaClient, GiteaError, GiteaForge, GiteaSettings};
pub use landing::GithubForge;
