//! the governed specification store and the ears-manager CLI.
