//! How long a remote may take before a fetch, push or ls-remote fails.
//!
//! libgit2 waits forever by default: a repository host that accepts a connection and never
//! answers would hold the operation, its thread and (in the operator) its Project's pass for
//! good, so the Project would never even back off. Every remote operation of this crate takes
//! its callbacks from [`crate::remote::Session::callbacks`], which applies the process's
//! [`NetworkTimeouts`] once, before the first operation: [`NetworkTimeouts::DEFAULT`] unless
//! [`configure`] chose others first.

use std::{sync::OnceLock, time::Duration};

/// libgit2's socket timeouts for remote operations (HTTPS and SSH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetworkTimeouts {
    /// Connecting to the remote.
    pub connect: Duration,
    /// The longest a connected remote may stay silent (per read or write, not the whole
    /// transfer: a large clone that keeps sending never trips it).
    pub silence: Duration,
}

impl NetworkTimeouts {
    /// 15 s to connect, 2 min of silence.
    pub const DEFAULT: NetworkTimeouts = NetworkTimeouts {
        connect: Duration::from_secs(15),
        silence: Duration::from_secs(120),
    };
}

/// Why [`configure`] did not apply the timeouts.
#[derive(Debug, thiserror::Error)]
pub enum TimeoutError {
    /// Already applied (by an earlier call, or by the first remote operation).
    #[error(
        "the git network timeouts are already set ({current:?}); configure them before the first remote operation"
    )]
    AlreadySet {
        /// The timeouts in force.
        current: NetworkTimeouts,
    },
    /// A value libgit2 cannot take (milliseconds beyond `i32`, or zero).
    #[error("a git network timeout of {0:?} is out of range: give 1 ms to 24 days")]
    OutOfRange(Duration),
    /// libgit2 refused the option.
    #[error("libgit2 refused the network timeout: {0}")]
    Git(#[source] git2::Error),
}

static APPLIED: OnceLock<Result<NetworkTimeouts, String>> = OnceLock::new();

/// Sets the process's timeouts; only before the first remote operation.
pub fn configure(timeouts: NetworkTimeouts) -> Result<(), TimeoutError> {
    let mut outcome = None;
    let applied = APPLIED.get_or_init(|| {
        let r = apply(timeouts);
        let kept = r.as_ref().map(|()| timeouts).map_err(|e| e.to_string());
        outcome = Some(r);
        kept
    });
    match outcome {
        Some(r) => r,
        None => Err(TimeoutError::AlreadySet {
            current: applied.clone().unwrap_or(NetworkTimeouts::DEFAULT),
        }),
    }
}

/// The timeouts in force, applying [`NetworkTimeouts::DEFAULT`] if none were configured.
/// An error (libgit2 refused them) is returned each time, so the operation can say so.
pub fn ensure() -> Result<NetworkTimeouts, String> {
    APPLIED
        .get_or_init(|| {
            apply(NetworkTimeouts::DEFAULT)
                .map(|()| NetworkTimeouts::DEFAULT)
                .map_err(|e| e.to_string())
        })
        .clone()
}

fn millis(d: Duration) -> Result<i32, TimeoutError> {
    i32::try_from(d.as_millis())
        .ok()
        .filter(|ms| *ms > 0)
        .ok_or(TimeoutError::OutOfRange(d))
}

// The one use of `unsafe` in the workspace: git2 marks libgit2's global options unsafe
// because they are process-wide and not synchronized with operations in flight. They are
// set here exactly once (the `OnceLock` above), before any remote operation of this process:
// every remote operation first calls `ensure`, which blocks until the setting is done.
#[allow(unsafe_code)]
fn apply(timeouts: NetworkTimeouts) -> Result<(), TimeoutError> {
    let (connect, silence) = (millis(timeouts.connect)?, millis(timeouts.silence)?);
    // SAFETY: see above; no remote operation runs while this does.
    unsafe {
        git2::opts::set_server_connect_timeout_in_milliseconds(connect)
            .map_err(TimeoutError::Git)?;
        git2::opts::set_server_timeout_in_milliseconds(silence).map_err(TimeoutError::Git)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_refused_before_libgit2_sees_them() {
        assert!(matches!(
            millis(Duration::ZERO),
            Err(TimeoutError::OutOfRange(_))
        ));
        assert!(matches!(
            millis(Duration::from_secs(30 * 24 * 3600)),
            Err(TimeoutError::OutOfRange(_))
        ));
        assert_eq!(millis(Duration::from_millis(1500)).ok(), Some(1500));
    }
}
