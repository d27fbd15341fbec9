//! Writing to stdout the way a command-line tool should: a reader that closes
//! the pipe early (`protobot status --output json | head`) ends the command
//! quietly with status 0 instead of a panic.

use std::{
    io::{self, Write},
    process::ExitCode,
};

/// Writes `text` and a newline to stdout. A closed pipe is not an error
/// (`Ok(false)`: stop writing); any other failure is.
pub fn write_line(out: &mut dyn Write, text: &str) -> io::Result<bool> {
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}

/// Prints `text` on stdout and returns the exit status: 0, also when the
/// reader closed the pipe; 1 with one line on stderr for any other failure.
pub fn print_line(text: &str) -> ExitCode {
    print_line_with(text, ExitCode::SUCCESS)
}

/// [`print_line`] with the status to return when the text was written (or the
/// pipe was closed).
pub fn print_line_with(text: &str, status: ExitCode) -> ExitCode {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    match write_line(&mut out, text) {
        Ok(_) => status,
        Err(e) => {
            eprintln!("protobot: failed to write to stdout: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Closed;
    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_stops_quietly_and_other_errors_are_reported() {
        assert!(matches!(write_line(&mut Closed, "x"), Ok(false)));
        assert!(write_line(&mut Full, "x").is_err());
        let mut buf = Vec::new();
        assert!(matches!(write_line(&mut buf, "a"), Ok(true)));
        assert_eq!(buf, b"a\n");
    }
}
