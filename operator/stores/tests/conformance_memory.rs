//! The WorkStore conformance suite against the in-memory backend.

use protobot_stores::{AdapterConfig, MemoryStore};

protobot_stores::workstore_conformance!(|project: String, cfg: AdapterConfig| async move {
    MemoryStore::new(&project, cfg)
});
