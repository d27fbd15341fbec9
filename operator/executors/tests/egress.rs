//! Proxied egress of the bubblewrap sandbox (issue 21), against a real
//! egress proxy and credential broker with the model double behind it: what
//! a run with egress can reach (only the proxy), what it holds (a signed,
//! expiring session token, never the API key), what the proxy does with its
//! requests (injects the key for the allowed host, denies and audits the
//! other one), and that DNS and direct connections fail at once. Runs as
//! root only; skipped with the reason otherwise, unless
//! `PROTOBOT_REQUIRE_EGRESS=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod proxied;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protobot_executors::{BubblewrapConfig, BubblewrapExecutor, LocalEgress};
use protobot_jobsite::executor::{Executor, Termination};
use protobot_model_double::Script;
use tokio::sync::watch;

fn no_cancel() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    std::mem::forget(tx);
    rx
}

fn read(dir: &std::path::Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name))
        .unwrap_or_else(|e| panic!("read {name}: {e}"))
        .trim()
        .to_owned()
}

/// What the sandbox does: one allowed request, one to another host through
/// the proxy, one straight to an address, DNS lookups, and the proxy's own
/// host port; each result and duration lands in /out.
const PROBE: &str = r#"
T=$(cat "$PROTOBOT_EGRESS_SESSION_TOKEN_FILE")
P=$PROTOBOT_EGRESS_PROXY
body='{"model":"scripted","messages":[{"role":"user","content":"hello EGRESS-PROBE"}]}'
curl -sS -o /out/allowed.body -w '%{http_code}' -H "X-Sandbox-Session-Token: $T" \
  -H 'Content-Type: application/json' -d "$body" "$P/model.example.invalid/v1/chat/completions" > /out/allowed.code
curl -sS -o /out/other.body -w '%{http_code}' -H "X-Sandbox-Session-Token: $T" \
  -H 'Content-Type: application/json' -d "$body" "$P/evil.example.invalid/v1/chat/completions" > /out/other.code
curl -sS -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" \
  "$P/model.example.invalid/v1/chat/completions" > /out/tokenless.code
ms() { echo $(( $(date +%s%N) / 1000000 )); }
s=$(ms); curl -sS --max-time 20 http://192.0.2.1/ 2>/out/direct.err; echo $? > /out/direct.rc; echo $(( $(ms) - s )) > /out/direct.ms
s=$(ms); curl -sS --max-time 20 https://example.com/ 2>/out/dns.err; echo $? > /out/dns.rc; echo $(( $(ms) - s )) > /out/dns.ms
s=$(ms); getent hosts example.com > /out/getent.out; echo $? > /out/getent.rc; echo $(( $(ms) - s )) > /out/getent.ms
curl -sS --max-time 5 "http://127.0.0.1:$HOST_PROXY_PORT/" 2>/out/hostport.err; echo $? > /out/hostport.rc
cat "$PROTOBOT_EGRESS_SESSION_TOKEN_FILE" > /out/token
env > /out/env
ls -A /task > /out/task-files
exit 0
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_egress_reaches_only_the_proxy_which_injects_the_key_for_the_allowed_host() {
    if !common::bwrap_available("egress") || !proxied::egress_available("egress") {
        return;
    }
    let proxy = proxied::start(Script::default()).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut config = BubblewrapConfig::under(tmp.path());
    let egress = LocalEgress::new(proxy.secret.clone());
    let grace = egress.token_grace;
    config.egress = Some(egress);
    let ex = BubblewrapExecutor::new(config);
    let ws = common::projection(tmp.path());
    let mut spec = common::spec(&ws, PROBE);
    spec.task = serde_json::json!({"role": "worker-b", "work_item_id": "wi-egress", "source_commit": "abc"});
    spec.egress_proxy = Some(proxy.proxy_url.clone());
    let host_port = proxy.proxy_url.rsplit(':').next().unwrap().to_owned();
    spec.env.insert("HOST_PROXY_PORT".into(), host_port);
    let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();

    let out = ex.run(spec.clone(), no_cancel()).await.unwrap();
    assert_eq!(
        out.termination,
        Termination::Exited { code: 0 },
        "{}",
        out.stderr_tail
    );
    let o = &out.out_dir;

    // The allowed request reached the model with the broker's key, and only
    // it: the sandbox's token and the proxy's own headers stayed behind.
    assert_eq!(
        read(o, "allowed.code"),
        "200",
        "{}",
        read(o, "allowed.body")
    );
    assert!(read(o, "allowed.body").contains("chat.completion"));
    let seen = proxy.double.requests();
    assert_eq!(
        seen.len(),
        1,
        "only the allowed request reached an upstream: {seen:?}"
    );
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {}", proxied::API_KEY).as_str())
    );
    assert_eq!(seen[0].header("host"), Some(proxied::MODEL_HOST));
    assert!(
        seen[0].headers.keys().all(|k| !k.starts_with("x-sandbox")),
        "{:?}",
        seen[0].headers
    );

    // The other host was denied by the policy, counted and audited.
    assert_eq!(read(o, "other.code"), "403");
    assert!(
        read(o, "other.body").contains("no-matching-rule"),
        "{}",
        read(o, "other.body")
    );
    assert_eq!(
        read(o, "tokenless.code"),
        "401",
        "a request without the token is unauthenticated"
    );
    assert_eq!(proxy.decisions("allowed"), 1);
    assert_eq!(proxy.decisions("denied"), 2);
    let audit = proxied::audited(proxied::OTHER_HOST);
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(
        audit[0].contains("no-matching-rule") && audit[0].contains("wi-egress"),
        "{}",
        audit[0]
    );

    // A direct connection and DNS fail, and fail at once.
    assert_eq!(
        read(o, "direct.rc"),
        "7",
        "curl: couldn't connect: {}",
        read(o, "direct.err")
    );
    assert_eq!(
        read(o, "dns.rc"),
        "6",
        "curl: couldn't resolve: {}",
        read(o, "dns.err")
    );
    assert_eq!(read(o, "getent.rc"), "2", "getent: not found");
    for probe in ["direct.ms", "dns.ms", "getent.ms"] {
        let ms: u64 = read(o, probe).parse().unwrap();
        assert!(ms < 2000, "{probe}: took {ms} ms");
    }
    // The proxy's host port is not reachable from inside; only the relay is.
    assert_eq!(read(o, "hostport.rc"), "7", "{}", read(o, "hostport.err"));

    // The sandbox held the contract's variables and a signed session token
    // for this run that expires with it, never the key.
    let env = read(o, "env");
    assert!(
        env.lines()
            .any(|l| l == "PROTOBOT_EGRESS_PROXY=http://127.0.0.1:3128"),
        "{env}"
    );
    assert!(
        env.lines()
            .any(|l| l == "PROTOBOT_EGRESS_SESSION_TOKEN_FILE=/task/egress-session-token")
    );
    assert!(!env.contains(proxied::API_KEY));
    assert_eq!(read(o, "task-files"), "egress-session-token\ntask.json");
    let token = read(o, "token");
    let session = protobot_egress::verify_session_token(
        &proxy.secret,
        &token,
        i64::try_from(started.as_secs()).unwrap(),
    )
    .expect("a token the proxy accepts");
    assert_eq!(session.work_item, "wi-egress");
    assert_eq!(session.role, "worker-b");
    assert_eq!(session.trace_id, spec.run_id);
    assert_eq!(session.source_commit, "abc");
    let after_deadline = started + spec.limits.wall_clock + grace + Duration::from_secs(5);
    assert!(
        protobot_egress::verify_session_token(
            &proxy.secret,
            &token,
            i64::try_from(after_deadline.as_secs()).unwrap()
        )
        .is_none(),
        "the token expires with the run"
    );

    // The namespace is gone with the run.
    assert_eq!(proxied::netns_of(&spec.run_id), Vec::<String>::new());
}

#[tokio::test]
async fn egress_is_refused_without_a_session_secret_or_with_a_bad_proxy_url() {
    if !common::bwrap_available("egress_refusals") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = common::projection(tmp.path());
    let mut spec = common::spec(&ws, "true");
    spec.egress_proxy = Some("http://127.0.0.1:3128".into());
    // No secret: refused, saying what to configure.
    let err = common::executor(tmp.path())
        .run(spec.clone(), no_cancel())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sandbox.fail_closed") && err.contains("egress session secret"),
        "{err}"
    );
    // A proxy URL the relay cannot use.
    let mut config = BubblewrapConfig::under(tmp.path());
    config.egress = Some(LocalEgress::new(protobot_egress::SessionSecret::new(
        vec![1u8; 32],
    )));
    let ex = BubblewrapExecutor::new(config);
    spec.egress_proxy = Some("https://proxy.internal:3128/v1".into());
    let err = ex.run(spec, no_cancel()).await.unwrap_err().to_string();
    assert!(err.contains("is not usable"), "{err}");
    assert!(
        common::entries(&tmp.path().join("scratch")).is_empty(),
        "nothing was prepared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_wall_clock_or_with_the_proxy_down_ends_and_leaves_no_namespace() {
    if !common::bwrap_available("egress_teardown") || !proxied::egress_available("egress_teardown")
    {
        return;
    }
    // A port nothing listens on: the relay accepts, fails to reach the
    // proxy, and closes the sandbox's connection at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_proxy = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let tmp = tempfile::tempdir().unwrap();
    let mut config = BubblewrapConfig::under(tmp.path());
    config.egress = Some(LocalEgress::new(protobot_egress::SessionSecret::new(
        vec![7u8; 32],
    )));
    let ex = BubblewrapExecutor::new(config);
    let ws = common::projection(tmp.path());

    let mut spec = common::spec(
        &ws,
        "curl -sS --max-time 20 \"$PROTOBOT_EGRESS_PROXY/model.example.invalid/v1/x\" 2>/out/err; echo $? > /out/rc",
    );
    spec.egress_proxy = Some(dead_proxy.clone());
    let started = std::time::Instant::now();
    let out = ex.run(spec, no_cancel()).await.unwrap();
    assert_eq!(out.termination, Termination::Exited { code: 0 });
    let rc = read(&out.out_dir, "rc");
    assert!(
        rc == "52" || rc == "56",
        "curl: empty reply or recv failure, got {rc}: {}",
        read(&out.out_dir, "err")
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the failure is fast"
    );

    let mut spec = common::spec(&ws, "sleep 60");
    spec.egress_proxy = Some(dead_proxy);
    spec.limits.wall_clock = Duration::from_secs(2);
    let run_id = spec.run_id.clone();
    let (done_tx, done_rx) = watch::channel(false);
    let run = async {
        let out = ex.run(spec, no_cancel()).await;
        let _ = done_tx.send(true);
        out
    };
    // While the run lasts, its namespace exists (so the check after it is not vacuous).
    let seen_during = async {
        let mut seen = false;
        while !*done_rx.borrow() {
            seen |= !proxied::netns_of(&run_id).is_empty();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen
    };
    let (out, seen_during) = tokio::join!(run, seen_during);
    assert_eq!(
        out.unwrap().termination,
        Termination::LimitExceeded {
            limit: "wall-clock".into()
        }
    );
    assert!(seen_during, "the run had a namespace named after it");
    assert_eq!(proxied::netns_of(&run_id), Vec::<String>::new());
    assert!(common::entries(&tmp.path().join("scratch")).is_empty());
}
