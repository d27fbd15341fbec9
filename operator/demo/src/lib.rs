//! The bundled `cli-sync` example and its authoring harness, apart from the Job Site
//! engine: they shell out to git and run ears-manager the way a person writing and
//! approving specifications does. `protobot demo` and `protobot eval` use them, and so do
//! the tests that need a real spec repository; no part of the engine or the operator does.
//!
//! - [`authoring`]: `git` and ears-manager (in-process) steps with errors that say what
//!   the tool said;
//! - [`example`]: the `cli-sync` project, its approved change set and the scripted Worker,
//!   integration and Inspector harnesses that build it.

pub mod authoring;
pub mod example;
