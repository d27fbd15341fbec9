//! Fault injection: error responses (409, 500, any code), added latency and
//! dropped watch connections, on chosen verbs and resources, a bounded number of
//! times. Controllers' retry paths are tested with these.

use std::{sync::Mutex, time::Duration};

use tokio::sync::watch;

/// An API verb, as used by RBAC and audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// Read one object (or a subresource).
    Get,
    /// List a collection.
    List,
    /// Watch a collection.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH (including server-side apply).
    Patch,
    /// DELETE one object.
    Delete,
    /// DELETE a collection.
    DeleteCollection,
}

/// How an injected fault ends a watch stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchCut {
    /// The connection breaks (the body ends with an error).
    Drop,
    /// An `ERROR` event with a 410 `Expired` status, then a clean end.
    Expire,
}

/// What an injected fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Answer with this HTTP code (409 renders as a `Conflict` on the object, 500 as `InternalError`).
    Status(u16),
    /// Delay the request.
    Latency(Duration),
    /// End matching watch streams abruptly after this many events.
    DropWatchAfter(usize),
    /// After this many events, send an `ERROR` 410 `Expired` event and end the
    /// stream, as when the server's watch cache compacts past the client.
    ExpireWatchAfter(usize),
}

/// One fault rule: verb, optional resource (plural) and name filters, action, count.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    verb: Verb,
    resource: Option<String>,
    name: Option<String>,
    action: FaultAction,
    remaining: Option<usize>,
}

impl FaultRule {
    /// A rule on `verb` for every resource; answers 500 until changed.
    pub fn on(verb: Verb) -> Self {
        Self {
            verb,
            resource: None,
            name: None,
            action: FaultAction::Status(500),
            remaining: None,
        }
    }

    /// Only for this resource plural (e.g. `configmaps`, `widgets`).
    pub fn resource(mut self, plural: &str) -> Self {
        self.resource = Some(plural.to_owned());
        self
    }

    /// Only for this object name.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// Answer with an error status code.
    pub fn status(mut self, code: u16) -> Self {
        self.action = FaultAction::Status(code);
        self
    }

    /// Delay matching requests instead of failing them.
    pub fn latency(mut self, delay: Duration) -> Self {
        self.action = FaultAction::Latency(delay);
        self
    }

    /// Drop matching watch streams after `events` events (use with [`Verb::Watch`]).
    pub fn drop_watch_after(mut self, events: usize) -> Self {
        self.action = FaultAction::DropWatchAfter(events);
        self
    }

    /// Expire matching watch streams (an `ERROR` 410 event) after `events` events
    /// (use with [`Verb::Watch`]): the client must relist.
    pub fn expire_watch_after(mut self, events: usize) -> Self {
        self.action = FaultAction::ExpireWatchAfter(events);
        self
    }

    /// Fire at most `n` times (default: every time).
    pub fn times(mut self, n: usize) -> Self {
        self.remaining = Some(n);
        self
    }

    fn matches(&self, verb: Verb, plural: &str, name: Option<&str>) -> bool {
        self.verb == verb
            && self.remaining != Some(0)
            && self.resource.as_deref().is_none_or(|r| r == plural)
            && self.name.as_deref().is_none_or(|n| Some(n) == name)
    }
}

/// Faults to apply to one request, after consuming matching rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Triggered {
    /// Total added latency.
    pub latency: Duration,
    /// An error status to answer with.
    pub status: Option<u16>,
    /// End the watch after this many events, and how.
    pub cut_watch: Option<(usize, WatchCut)>,
}

/// The fault registry of one server.
#[derive(Debug)]
pub struct Faults {
    rules: Mutex<Vec<FaultRule>>,
    drop_epoch: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            rules: Mutex::new(Vec::new()),
            drop_epoch: watch::Sender::new(0),
        }
    }
}

impl Faults {
    /// Add a rule.
    pub fn inject(&self, rule: FaultRule) {
        self.lock().push(rule);
    }

    /// Remove every rule.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Drop every open watch connection now (the stream ends with an error, as
    /// when a TCP connection breaks). New watches are unaffected.
    pub fn drop_watches(&self) {
        self.drop_epoch.send_modify(|e| *e += 1);
    }

    /// Subscribe to connection drops.
    pub(crate) fn drops(&self) -> watch::Receiver<u64> {
        self.drop_epoch.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<FaultRule>> {
        self.rules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Consume the rules that match a request.
    pub(crate) fn trigger(&self, verb: Verb, plural: &str, name: Option<&str>) -> Triggered {
        let mut out = Triggered::default();
        for rule in self
            .lock()
            .iter_mut()
            .filter(|r| r.matches(verb, plural, name))
        {
            match rule.action {
                FaultAction::Latency(d) => out.latency += d,
                FaultAction::Status(code) if out.status.is_none() => out.status = Some(code),
                FaultAction::DropWatchAfter(n) if out.cut_watch.is_none() => {
                    out.cut_watch = Some((n, WatchCut::Drop))
                }
                FaultAction::ExpireWatchAfter(n) if out.cut_watch.is_none() => {
                    out.cut_watch = Some((n, WatchCut::Expire))
                }
                _ => continue,
            }
            if let Some(n) = rule.remaining.as_mut() {
                *n -= 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_fire_only_on_their_verb_resource_and_count() {
        let f = Faults::default();
        f.inject(
            FaultRule::on(Verb::Update)
                .resource("configmaps")
                .status(409)
                .times(1),
        );
        assert_eq!(f.trigger(Verb::Get, "configmaps", None).status, None);
        assert_eq!(f.trigger(Verb::Update, "secrets", None).status, None);
        assert_eq!(
            f.trigger(Verb::Update, "configmaps", Some("a")).status,
            Some(409)
        );
        assert_eq!(
            f.trigger(Verb::Update, "configmaps", Some("a")).status,
            None
        );
    }
}
