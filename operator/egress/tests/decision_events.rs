//! The egress proxy's decision events, in a test binary of their own: the test installs
//! its capturing subscriber as the thread's default, and tracing caches whether a callsite
//! is enabled process-wide — a concurrent test of the same binary that reached the
//! `egress decision` callsite first, with no subscriber, could leave it disabled for this
//! test too (0 events; it failed about one run in two under `cargo test`). Alone in its
//! process, nothing races it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    collections::BTreeSet,
    io::Write,
    sync::{Arc, Mutex},
};

use support::*;

/// A `MakeWriter` collecting formatted events.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;

    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn decision_events_name_the_session_and_never_hold_credential_or_token() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(capture.clone())
        .with_max_level(tracing::Level::TRACE)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let h = start().await;
    Call::get(&h, &allowed_url()).send().await;
    Call::get(&h, &format!("/{DEST}/v2/redirect")).send().await;
    // The session token (and a credential-looking string) smuggled into the path.
    Call::get(&h, &format!("/{DEST}/v2/{}/{CREDENTIAL}", h.token))
        .send()
        .await;
    Call::get(&h, &allowed_url())
        .with("authorization", &format!("Bearer {CREDENTIAL}"))
        .send()
        .await;
    Call::get(&h, "/127.0.0.1/v2/allowed").send().await;

    let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(!text.contains(CREDENTIAL), "credential logged:\n{text}");
    assert!(!text.contains(&h.token), "session token logged:\n{text}");
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| {
            e["target"] == "protobot::egress" && e["fields"]["message"] == "egress decision"
        })
        .collect();
    assert_eq!(events.len(), 5, "one event per request:\n{text}");
    let reasons: BTreeSet<_> = events
        .iter()
        .map(|e| e["fields"]["reason"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        reasons,
        BTreeSet::from(
            [
                "rule-matched",
                "upstream-redirect",
                "no-matching-rule",
                "caller-authorization",
                "direct-ip"
            ]
            .map(str::to_owned)
        )
    );
    let first = &events[0]["fields"];
    assert_eq!(first["work_item"], "wi-egress-1");
    assert_eq!(first["role"], "worker-b");
    assert_eq!(first["trace_id"], "trace-jobsite-sandbox-v1");
    assert_eq!(first["destination"], DEST);
    assert_eq!(first["method"], "GET");
    assert_eq!(first["path"], "/v2/allowed");
    assert_eq!(first["outcome"], "allowed");
}
