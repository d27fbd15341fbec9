//! `ears-manager`: the only reader and writer of governed specification
//! state. All behaviour lives in [`protobot_spec::cli::run`]; this file only
//! connects it to the process, and turns an unexpected panic into the
//! `internal.failure` envelope (status 70) instead of a Rust backtrace, so
//! JSON callers still get exactly one document and an empty stderr.

use std::{io::Write, panic::AssertUnwindSafe};

use protobot_spec::cli::{self, Env};

fn main() {
    // `env::args()` panics on an argument that is not UTF-8: read them raw and answer
    // with the usage envelope instead.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let args: Vec<String> = raw
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let not_utf8 = raw.iter().position(|a| a.to_str().is_none());
    let cwd = std::env::current_dir().unwrap_or_else(|_| std::path::PathBuf::from("."));
    std::panic::set_hook(Box::new(|_| {}));
    let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
        if let Some(index) = not_utf8 {
            return cli::non_utf8_argument(&args, index);
        }
        let mut stdin = std::io::stdin();
        let mut env = Env {
            cwd: &cwd,
            stdin: &mut stdin,
            faults: Default::default(),
        };
        cli::run(&args, &mut env)
    }))
    .unwrap_or_else(|_| cli::internal_failure(&args));
    let _ = std::io::stdout().write_all(ran.stdout.as_bytes());
    let _ = std::io::stderr().write_all(ran.stderr.as_bytes());
    std::process::exit(ran.status);
}
