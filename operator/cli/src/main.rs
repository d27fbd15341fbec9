//! The `protobot` command-line interface.

fn main() {}
