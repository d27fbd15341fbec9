//! `protobot rules evaluate`: reads one JSON document on stdin, evaluates it with
//! the embedded validation-rules/v1 evaluator and prints `{"result", "record",
//! "idempotency"}`, with `--with-audit` also `"audit"` (the events produced).
//! The input format is documented in `protobot_lifecycle::inspect`. Malformed
//! input exits 2 with one line naming the field; an evaluated rejection is a
//! normal answer and exits 0.

use std::{
    io::{Read, Write},
    process::ExitCode,
};

use protobot_lifecycle::inspect::{evaluate_document, evaluate_document_with_audit};

/// Runs the command against the process's stdin and stdout.
pub fn run_evaluate(with_audit: bool) -> ExitCode {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("protobot rules evaluate: failed to read stdin: {e}");
        return ExitCode::from(2);
    }
    let evaluated = if with_audit {
        evaluate_document_with_audit(&input)
    } else {
        evaluate_document(&input)
    };
    match evaluated {
        Ok(out) => {
            let mut stdout = std::io::stdout().lock();
            match serde_json::to_writer_pretty(&mut stdout, &out).map(|()| writeln!(stdout)) {
                Ok(Ok(())) => ExitCode::SUCCESS,
                _ => {
                    eprintln!("protobot rules evaluate: failed to write the result to stdout");
                    ExitCode::from(1)
                }
            }
        }
        Err(e) => {
            eprintln!("protobot rules evaluate: {e}");
            ExitCode::from(2)
        }
    }
}
