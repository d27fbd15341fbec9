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

/// GitHub's documented pacing for requests that create or change content (`POST`, `PATCH`,
/// `PUT`, `DELETE`; "Best practices for using the REST API", "Rate limits for the REST API"):
/// one at a time, at least a second apart, no more than 80 a minute and 500 an hour. Staying
/// inside it keeps a burst of items landing at once clear of the secondary limits instead of
/// waiting them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// The least time between the starts of two mutations.
    pub min_spacing: Duration,
    /// Most mutations started in any 60 s.
    pub per_minute: usize,
    /// Most mutations started in any hour.
    pub per_hour: usize,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            min_spacing: Duration::from_secs(1),
            per_minute: 80,
            per_hour: 500,
        }
    }
}

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

impl Pacing {
    /// How long the next mutation must wait at `now`, given when the earlier ones started
    /// (`sent`, oldest first, on the same clock as `now`).
    pub fn wait(&self, sent: &[Duration], now: Duration) -> Duration {
        let mut until = Duration::ZERO;
        if let Some(last) = sent.last() {
            until = until.max(*last + self.min_spacing);
        }
        for (window, limit) in [(MINUTE, self.per_minute), (HOUR, self.per_hour)] {
            let inside: Vec<&Duration> = sent.iter().filter(|t| **t + window > now).collect();
            if limit == 0 {
                continue;
            }
            if inside.len() >= limit {
                // The window must drop enough of its oldest to leave room for one more.
                let drop = inside.len() - limit;
                if let Some(t) = inside.get(drop) {
                    until = until.max(**t + window);
                }
            }
        }
        until.saturating_sub(now)
    }

    /// Forgets mutations older than the longest window.
    pub fn prune(sent: &mut std::collections::VecDeque<Duration>, now: Duration) {
        while sent.front().is_some_and(|t| *t + HOUR <= now) {
            sent.pop_front();
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

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn mutations_are_spaced_a_second_apart() {
        let p = Pacing::default();
        assert_eq!(p.wait(&[], secs(0)), Duration::ZERO);
        assert_eq!(p.wait(&[secs(10)], secs(10)), secs(1));
        assert_eq!(
            p.wait(&[secs(10)], Duration::from_millis(10_400)),
            Duration::from_millis(600)
        );
        assert_eq!(p.wait(&[secs(10)], secs(12)), Duration::ZERO);
    }

    #[test]
    fn the_minute_and_hour_budgets_hold_in_every_window() {
        let p = Pacing {
            min_spacing: Duration::ZERO,
            per_minute: 3,
            per_hour: 5,
        };
        // Three in the last minute: the next waits until the oldest leaves the window.
        assert_eq!(
            p.wait(&[secs(100), secs(110), secs(120)], secs(130)),
            secs(30)
        );
        // Five in the hour (spread over minutes): the next waits for the oldest to age out.
        let hour = [secs(0), secs(600), secs(1200), secs(1800), secs(2400)];
        assert_eq!(p.wait(&hour, secs(3000)), secs(600));
        // Simulated: a burst of 200 under the defaults never puts more than 80 in a minute
        // nor two within a second.
        let p = Pacing::default();
        let mut sent: Vec<Duration> = Vec::new();
        let mut now = Duration::ZERO;
        for _ in 0..200 {
            now += p.wait(&sent, now);
            sent.push(now);
        }
        for (i, t) in sent.iter().enumerate() {
            let in_minute = sent[i..].iter().take_while(|u| **u < *t + MINUTE).count();
            assert!(in_minute <= 80, "{in_minute} at {t:?}");
            if let Some(next) = sent.get(i + 1) {
                assert!(*next - *t >= secs(1));
            }
        }
        let mut queue: std::collections::VecDeque<Duration> = sent.into_iter().collect();
        Pacing::prune(&mut queue, now + HOUR);
        assert!(queue.len() <= 1, "{}", queue.len());
    }
}
