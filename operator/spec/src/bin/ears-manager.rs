//! `ears-manager`: the only reader and writer of governed specification
//! state. All behaviour lives in [`protobot_spec::cli::run`]; this file only
//! connects it to the process.

use std::io::Write;

use protobot_spec::cli::{self, Env};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cwd = std::env::current_dir().unwrap_or_else(|_| std::path::PathBuf::from("."));
    let mut stdin = std::io::stdin();
    let mut env = Env {
        cwd: &cwd,
        stdin: &mut stdin,
        faults: Default::default(),
    };
    let ran = cli::run(&args, &mut env);
    let _ = std::io::stdout().write_all(ran.stdout.as_bytes());
    let _ = std::io::stderr().write_all(ran.stderr.as_bytes());
    std::process::exit(ran.status);
}
