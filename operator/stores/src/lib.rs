//! WorkStore port, its in-memory backend and the backend conformance suite.
