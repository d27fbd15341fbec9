//! The pure core of the forge: every decision the GitHub shell acts on, made from typed
//! values and raw response parts (status, headers, body bytes), with no network and no clock
//! of its own (callers pass `now`).
//!
//! - [`coordinates`]: which repository (owner/name from the Project's `repoUrl` or its forge
//!   settings) and which API base URL;
//! - [`approval`]: is this pull request an approved merge of change set X under review mode M;
//! - [`merge`]: what the merge API answered, and what a refused merge means for the lifecycle;
//! - [`render`]: sanitized text, the pull-request body rendered from the inspection report;
//! - [`escalation`]: the one escalation issue per work item (title, body, marker, open or update);
//! - [`gitea`]: what Gitea's answers mean (merge refusals, required contexts, reviews, labels);
//! - [`status`]: commit statuses per stage;
//! - [`ratelimit`]: how long to wait, from GitHub's rate-limit headers;
//! - [`page`]: pagination (`Link` header) that never leaves the API's origin;
//! - [`wire`]: the response fields read, as typed values (malformed bodies are errors).

pub mod approval;
pub mod coordinates;
pub mod escalation;
pub mod gitea;
pub mod merge;
pub mod page;
pub mod ratelimit;
pub mod render;
pub mod status;
pub mod wire;
