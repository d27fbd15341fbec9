//! The Job Site engine of protobot.
//!
//! It turns an approved change set into merged, tested, inspected code and talks
//! only to its ports: the `WorkStore` (the WMS), the `Executor` (run one
//! sandboxed role and collect its output) and, optionally, a
//! [`usage::UsageSource`] (what a run spent on model calls, read back from the
//! egress proxy). Nothing here knows Kubernetes,
//! SQLite or bubblewrap; the same engine runs in the operator and on one machine.
//!
//! This first slice holds the deterministic policies the engine is built from:
//! - [`escalation`]: worker tiers and retry budgets by error class;
//! - [`dispatch`]: which ready items to claim, by priority, age, WIP and conflicts;
//! - [`triage`]: who is at fault when the integration run fails;
//! - [`sanitizer`]: the only Worker-facing boundary for feedback;
//! - [`ledger`]: the Finding Ledger state machine and the Inspection Run seal;
//! - [`landing`]: how `merging` lands (direct push, or a pull request on a forge).
//!
//! The engine itself is [`engine`] (one module per stage) over [`site`] (one pass: reconcile,
//! resume, dispatch) and [`builds`] (each build a task of its own). The bundled `cli-sync`
//! example and its authoring harness, which shell out to git, live in `protobot-demo`.

pub mod builds;
pub mod capacity;
pub mod contract;
pub mod dispatch;
pub mod engine;
pub mod escalation;
pub mod executor;
pub mod inspection;
pub mod intake;
pub mod landing;
pub mod lease;
pub mod ledger;
pub mod materializer;
pub mod repo_folder;
pub mod resolution;
pub mod sandbox_audit;
pub mod sanitizer;
#[cfg(feature = "test-support")]
pub mod scripted;
pub mod site;
pub mod snapshots;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod triage;
pub mod usage;
