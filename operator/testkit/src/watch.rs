//! Watch streams: optional initial `ADDED` events (no resourceVersion, `"0"` or
//! `sendInitialEvents=true` with an `initial-events-end` bookmark), then every
//! change after the start resourceVersion from the bounded history, periodic
//! `BOOKMARK`s, selector transitions (`ADDED`/`DELETED` when an object starts or
//! stops matching), `410 Expired` as an `ERROR` event, timeouts and drops.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::{sync::mpsc, time::Instant};

use crate::{
    body::{BodyError, ResponseBody},
    error::ApiError,
    faults::WatchCut,
    handler::present,
    resources::ResourceType,
    selector::{FieldSelector, LabelSelector},
    server::Shared,
    store::{Event, EventType},
};

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Synthetic `ADDED` events for the current state, then changes.
    Initial,
    /// Changes after this resourceVersion.
    After(u64),
}

/// A parsed watch request.
#[derive(Debug, Clone)]
pub struct WatchParams {
    /// Start point.
    pub start: Start,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: end the initial events with a marked bookmark.
    pub send_initial_events: bool,
    /// `timeoutSeconds`.
    pub timeout: Duration,
    /// Namespace filter.
    pub namespace: Option<String>,
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// Version objects are served at.
    pub version: String,
    /// Serve `PartialObjectMetadata` instead of full objects.
    pub metadata_only: bool,
    /// Injected fault: end the stream after this many events (bookmarks not counted).
    pub cut_after: Option<(usize, WatchCut)>,
}

struct Sink {
    tx: mpsc::Sender<Result<Bytes, BodyError>>,
    sent: usize,
    cut_after: Option<(usize, WatchCut)>,
}

impl Sink {
    /// Send one event line; `false` when the stream should end.
    async fn send(&mut self, ty: &str, object: Value) -> bool {
        let mut line = json!({"type": ty, "object": object})
            .to_string()
            .into_bytes();
        line.push(b'\n');
        if self.tx.send(Ok(Bytes::from(line))).await.is_err() {
            return false;
        }
        if ty == "BOOKMARK" {
            return true;
        }
        self.sent += 1;
        match self.cut_after {
            Some((n, cut)) if self.sent >= n => {
                let end = match cut {
                    WatchCut::Drop => Err(BodyError::Dropped),
                    WatchCut::Expire => {
                        let status =
                            ApiError::expired("testkit: injected watch expiry").to_status();
                        let mut line = json!({"type": "ERROR", "object": status})
                            .to_string()
                            .into_bytes();
                        line.push(b'\n');
                        Ok(Bytes::from(line))
                    }
                };
                let _ = self.tx.send(end).await;
                false
            }
            _ => true,
        }
    }
}

fn bookmark(rt: &ResourceType, version: &str, rv: u64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": rt.kind, "apiVersion": rt.api_version(version), "metadata": meta})
}

fn matches(p: &WatchParams, obj: &Value) -> bool {
    p.labels.matches(obj) && p.fields.matches(obj)
}

/// The event to emit for a history entry, if any, after filtering.
fn translate(p: &WatchParams, ev: &Event) -> Option<&'static str> {
    if p.namespace
        .as_deref()
        .is_some_and(|ns| ns != ev.key.namespace)
    {
        return None;
    }
    let now = matches(p, &ev.object);
    let before = ev.old.as_ref().map(|o| matches(p, o));
    match (ev.kind, before, now) {
        (EventType::Added, _, true) => Some("ADDED"),
        (EventType::Deleted, _, true) => Some("DELETED"),
        (EventType::Modified, Some(true), true) => Some("MODIFIED"),
        (EventType::Modified, Some(false) | None, true) => Some("ADDED"),
        (EventType::Modified, Some(true), false) => Some("DELETED"),
        _ => None,
    }
}

/// Start a watch and return its streaming body.
pub fn spawn(shared: Arc<Shared>, rt: ResourceType, params: WatchParams) -> ResponseBody {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(run(shared, rt, params, tx));
    ResponseBody::stream(rx)
}

async fn run(
    shared: Arc<Shared>,
    rt: ResourceType,
    p: WatchParams,
    tx: mpsc::Sender<Result<Bytes, BodyError>>,
) {
    let mut changed = shared.changed.subscribe();
    let mut drops = shared.faults.drops();
    drops.borrow_and_update();
    let deadline = Instant::now() + p.timeout;
    let mut sink = Sink {
        tx,
        sent: 0,
        cut_after: p.cut_after,
    };
    let (initial, mut cursor) = {
        let state = shared.lock();
        match p.start {
            Start::Initial => {
                let (items, rv) = state.list(&rt, p.namespace.as_deref(), &p.labels, &p.fields);
                (items, rv)
            }
            Start::After(rv) => (Vec::new(), rv),
        }
    };
    for (_, obj) in &initial {
        if !sink
            .send("ADDED", present(&rt, &p.version, obj, p.metadata_only))
            .await
        {
            return;
        }
    }
    if p.send_initial_events
        && !sink
            .send("BOOKMARK", bookmark(&rt, &p.version, cursor, true))
            .await
    {
        return;
    }
    let interval = shared.config.bookmark_interval;
    let mut next_bookmark = Instant::now() + interval;
    loop {
        changed.borrow_and_update();
        let batch = {
            let state = shared.lock();
            state
                .events_since(cursor, &rt.group, &rt.plural)
                .map(|evs| (evs, state.resource_version()))
        };
        match batch {
            Err(gone) => {
                let _ = sink.send("ERROR", gone.to_status()).await;
                return;
            }
            Ok((events, rv)) => {
                for ev in events {
                    if let Some(ty) = translate(&p, &ev)
                        && !sink
                            .send(ty, present(&rt, &p.version, &ev.object, p.metadata_only))
                            .await
                    {
                        return;
                    }
                }
                cursor = cursor.max(rv);
            }
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = drops.changed() => {
                let _ = sink.tx.send(Err(BodyError::Dropped)).await;
                return;
            }
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tokio::time::sleep_until(next_bookmark), if p.bookmarks => {
                next_bookmark = Instant::now() + interval;
                if !sink.send("BOOKMARK", bookmark(&rt, &p.version, cursor, false)).await {
                    return;
                }
            }
            _ = sink.tx.closed() => return,
        }
    }
}
