//! How long to wait after GitHub limited a request, from its headers (GitHub docs, "Rate
//! limits for the REST API" and "Best practices for using the REST API"):
//!
//! 1. `retry-after` present: wait that many seconds;
//! 2. else `x-ratelimit-remaining: 0`: wait until `x-ratelimit-reset` (UTC epoch seconds);
//! 3. else a secondary limit (403/429 whose message says so, or a 429 with no headers): wait at
//!    least one minute, doubling on every further hit.
//!
//! [`RetryPolicy::decide`] bounds the retries: a wait longer than the policy allows, or one
//! attempt too many, is given up as a transient failure the caller reports, never an endless
//! loop.

use std::time::Duration;

use http::{HeaderMap, StatusCode};

/// Which limit GitHub applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitKind {
    /// The hourly request budget is spent.
    Primary,
    /// A secondary (abuse) limit: too many requests, too fast or too concurrent.
    Secondary,
}

impl LimitKind {
    /// A stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Primary => "primary",
            LimitKind::Secondary => "secondary",
        }
    }
}

/// GitHub limited a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimited {
    /// Which limit.
    pub kind: LimitKind,
    /// How long to wait before the next attempt.
    pub wait: Duration,
}

/// The floor GitHub asks for after a secondary limit without `retry-after`.
pub const SECONDARY_MIN_WAIT: Duration = Duration::from_secs(60);

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// Whether the response says GitHub limited the request, and how long to wait.
/// `now_epoch` is the current UTC time in seconds; `previous_secondary` counts the secondary
/// limits this request hit before (the back-off doubles with each).
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    message: Option<&str>,
    now_epoch: i64,
    previous_secondary: u32,
) -> Option<RateLimited> {
    if status != StatusCode::FORBIDDEN && status != StatusCode::TOO_MANY_REQUESTS {
        return None;
    }
    let says_secondary = message.is_some_and(|m| {
        let m = m.to_ascii_lowercase();
        m.contains("secondary rate limit") || m.contains("abuse")
    });
    let says_rate_limit = message.is_some_and(|m| m.to_ascii_lowercase().contains("rate limit"));
    let remaining = header_u64(headers, "x-ratelimit-remaining");
    if let Some(seconds) = header_u64(headers, "retry-after") {
        let kind = if remaining == Some(0) && !says_secondary {
            LimitKind::Primary
        } else {
            LimitKind::Secondary
        };
        return Some(RateLimited {
            kind,
            wait: Duration::from_secs(seconds),
        });
    }
    if remaining == Some(0) && !says_secondary {
        let reset = header_u64(headers, "x-ratelimit-reset")
            .and_then(|r| i64::try_from(r).ok())
            .unwrap_or(now_epoch + 60);
        // One extra second: GitHub's reset is inclusive and clocks drift.
        let wait = u64::try_from(reset.saturating_sub(now_epoch)).unwrap_or(0) + 1;
        return Some(RateLimited {
            kind: LimitKind::Primary,
            wait: Duration::from_secs(wait),
        });
    }
    if says_secondary || says_rate_limit || status == StatusCode::TOO_MANY_REQUESTS {
        let factor = 1u32.checked_shl(previous_secondary.min(6)).unwrap_or(64);
        return Some(RateLimited {
            kind: LimitKind::Secondary,
            wait: SECONDARY_MIN_WAIT * factor,
        });
    }
    // A 403 that is not about limits (permissions, protection): not a rate limit.
    None
}

/// How many limited attempts a request may make, and the longest wait accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Limited attempts retried before giving up (ARCHITECTURE.md §5: rate limits 5).
    pub max_retries: u32,
    /// A wait longer than this is given up at once (the caller retries the stage later).
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            max_wait: Duration::from_secs(15 * 60),
        }
    }
}

/// What to do after a limited attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Sleep, then send the request again.
    Wait(Duration),
    /// Stop: report the limit (with the wait GitHub asked for).
    GiveUp,
}

impl RetryPolicy {
    /// The decision after the `hits`-th limited attempt (1-based).
    pub fn decide(&self, limited: RateLimited, hits: u32) -> RetryDecision {
        if hits > self.max_retries || limited.wait > self.max_wait {
            RetryDecision::GiveUp
        } else {
            RetryDecision::Wait(limited.wait)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn retry_after_wins() {
        let h = headers(&[("retry-after", "30"), ("x-ratelimit-remaining", "0")]);
        let l = classify(StatusCode::FORBIDDEN, &h, None, 1000, 0).unwrap();
        assert_eq!(l.wait, Duration::from_secs(30));
        assert_eq!(l.kind, LimitKind::Primary);
        let l = classify(
            StatusCode::TOO_MANY_REQUESTS,
            &headers(&[("retry-after", "7")]),
            Some("You have exceeded a secondary rate limit"),
            1000,
            3,
        )
        .unwrap();
        assert_eq!(
            (l.kind, l.wait),
            (LimitKind::Secondary, Duration::from_secs(7))
        );
    }

    #[test]
    fn an_exhausted_primary_limit_waits_until_the_reset() {
        let h = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1120"),
        ]);
        let l = classify(
            StatusCode::FORBIDDEN,
            &h,
            Some("API rate limit exceeded"),
            1000,
            0,
        )
        .unwrap();
        assert_eq!(
            (l.kind, l.wait),
            (LimitKind::Primary, Duration::from_secs(121))
        );
        // A reset in the past still waits a second, never a negative time.
        let h = headers(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "10")]);
        assert_eq!(
            classify(StatusCode::FORBIDDEN, &h, None, 1000, 0)
                .unwrap()
                .wait,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn secondary_limits_without_headers_wait_a_minute_and_double() {
        let msg = Some("You have exceeded a secondary rate limit. Please wait a few minutes");
        let none = HeaderMap::new();
        let waits: Vec<u64> = (0..3)
            .map(|hits| {
                classify(StatusCode::FORBIDDEN, &none, msg, 0, hits)
                    .unwrap()
                    .wait
                    .as_secs()
            })
            .collect();
        assert_eq!(waits, vec![60, 120, 240]);
        // The doubling is capped, never overflows.
        assert_eq!(
            classify(StatusCode::TOO_MANY_REQUESTS, &none, None, 0, u32::MAX)
                .unwrap()
                .wait,
            Duration::from_secs(60 * 64)
        );
    }

    #[test]
    fn a_forbidden_that_is_not_a_limit_is_not_retried() {
        let h = headers(&[("x-ratelimit-remaining", "4999")]);
        assert_eq!(
            classify(
                StatusCode::FORBIDDEN,
                &h,
                Some("Resource not accessible by integration"),
                0,
                0
            ),
            None
        );
        assert_eq!(
            classify(StatusCode::OK, &HeaderMap::new(), None, 0, 0),
            None
        );
        // Malformed header values are ignored, not trusted.
        let h = headers(&[("retry-after", "soon"), ("x-ratelimit-remaining", "x")]);
        assert_eq!(
            classify(StatusCode::FORBIDDEN, &h, Some("nope"), 0, 0),
            None
        );
    }

    #[test]
    fn the_policy_gives_up_after_its_budget_or_on_long_waits() {
        let p = RetryPolicy::default();
        let short = RateLimited {
            kind: LimitKind::Secondary,
            wait: Duration::from_secs(60),
        };
        assert_eq!(
            p.decide(short, 1),
            RetryDecision::Wait(Duration::from_secs(60))
        );
        assert_eq!(
            p.decide(short, 5),
            RetryDecision::Wait(Duration::from_secs(60))
        );
        assert_eq!(p.decide(short, 6), RetryDecision::GiveUp);
        let long = RateLimited {
            kind: LimitKind::Primary,
            wait: Duration::from_secs(3600),
        };
        assert_eq!(p.decide(long, 1), RetryDecision::GiveUp);
    }
}
