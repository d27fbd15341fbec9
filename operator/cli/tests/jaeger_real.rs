//! The OTLP traces judged by a real Jaeger (`scripts/jaeger up`, docs/tracing.md): `protobot
//! demo` runs with the standard `OTEL_EXPORTER_OTLP_*` variables pointing at Jaeger's OTLP/HTTP
//! receiver; the test then reads the demo build's trace back through Jaeger's query API and
//! checks the span tree: one root `build` span per build attempt carrying the item id and the
//! fencing token, the cycles, inspection and merge in order under it, Worker A, Worker B,
//! the integration gate and triage in each cycle, each sandbox run under its stage; and that
//! no requirement, feedback or Worker text is anywhere in what Jaeger holds.
//!
//! Without a Jaeger (`PROTOBOT_JAEGER_ENV`, the file `scripts/jaeger up` prints, or its default
//! place under `$PROTOBOT_TOOLS`) the test prints why and passes; with
//! `PROTOBOT_REQUIRE_JAEGER=1` it fails instead (CI sets it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, HashMap},
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

/// What `scripts/jaeger up` wrote.
struct Jaeger {
    otlp_endpoint: String,
    query_url: String,
}

fn jaeger() -> Option<Jaeger> {
    let require = std::env::var("PROTOBOT_REQUIRE_JAEGER").as_deref() == Ok("1");
    let default_file = std::env::var_os("PROTOBOT_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools"))
        .join("jaeger-env/env");
    let file = std::env::var_os("PROTOBOT_JAEGER_ENV")
        .map(PathBuf::from)
        .unwrap_or(default_file);
    let mut vars: BTreeMap<String, String> = std::env::vars().collect();
    if let Ok(text) = std::fs::read_to_string(&file) {
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.trim().to_owned(), v.trim().to_owned());
            }
        }
    }
    let found = match (
        vars.get("PROTOBOT_JAEGER_OTLP_ENDPOINT"),
        vars.get("PROTOBOT_JAEGER_QUERY_URL"),
    ) {
        (Some(otlp), Some(query)) => Some(Jaeger {
            otlp_endpoint: otlp.clone(),
            query_url: query.clone(),
        }),
        _ => None,
    };
    let reason = match &found {
        None => format!(
            "no Jaeger configured (run `scripts/jaeger up`; looked for PROTOBOT_JAEGER_ENV or {})",
            file.display()
        ),
        Some(j) => match get(&j.query_url, "/api/services") {
            Ok(_) => return found,
            Err(e) => format!("Jaeger at {} does not answer ({e})", j.query_url),
        },
    };
    if require {
        panic!("PROTOBOT_REQUIRE_JAEGER=1 but {reason}");
    }
    eprintln!("skipped: {reason}");
    None
}

/// `GET base+path` over plain HTTP/1.0 (no client library: the query API is loopback HTTP).
fn get(base: &str, path: &str) -> Result<Value, String> {
    let host = base
        .strip_prefix("http://")
        .ok_or_else(|| format!("{base} is not http://"))?
        .trim_end_matches('/');
    let mut stream = TcpStream::connect(host).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("no HTTP header in the answer")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "{}: {body}",
            head.lines().next().unwrap_or_default()
        ));
    }
    serde_json::from_str(body).map_err(|e| format!("not JSON ({e}): {body}"))
}

fn bwrap_available() -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()))
        .unwrap_or(false)
}

/// One span as Jaeger returns it, with its tags as strings.
#[derive(Clone, Debug)]
struct Span {
    id: String,
    parent: Option<String>,
    name: String,
    start: u64,
    end: u64,
    tags: HashMap<String, String>,
}

impl Span {
    fn tag(&self, key: &str) -> &str {
        self.tags.get(key).map(String::as_str).unwrap_or_default()
    }
}

fn spans_of(trace: &Value) -> Vec<Span> {
    trace["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let start = s["startTime"].as_u64().unwrap();
            Span {
                id: s["spanID"].as_str().unwrap().to_owned(),
                parent: s["references"].as_array().and_then(|r| {
                    r.iter()
                        .find(|r| r["refType"] == "CHILD_OF")
                        .map(|r| r["spanID"].as_str().unwrap().to_owned())
                }),
                name: s["operationName"].as_str().unwrap().to_owned(),
                start,
                end: start + s["duration"].as_u64().unwrap(),
                tags: s["tags"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| {
                        let v = &t["value"];
                        let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                        (t["key"].as_str().unwrap().to_owned(), v)
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The children of `parent`, in start order.
fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    let mut c: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent.as_deref() == Some(parent.id.as_str()))
        .collect();
    c.sort_by_key(|s| s.start);
    c
}

fn named<'a>(spans: &[&'a Span], name: &str) -> Vec<&'a Span> {
    spans.iter().copied().filter(|s| s.name == name).collect()
}

#[tokio::test]
async fn the_demo_build_is_one_trace_with_each_stage_and_sandbox_run_in_place() {
    let Some(jaeger) = jaeger() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let service = format!(
        "protobot-demo-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let mut args = vec!["demo", "--output", "json", "--dir", dir.to_str().unwrap()];
    if !bwrap_available() {
        // The same engine and span tree, Workers as plain processes.
        args.push("--insecure-no-sandbox");
    }
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(&args)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &jaeger.otlp_endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_SERVICE_NAME", &service)
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_EXPORTER")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        !stderr.contains("warning"),
        "the export raised a warning: {stderr}"
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let work_item = report["work_item"].as_str().unwrap().to_owned();
    eprintln!(
        "demo exported to {} as {service} in {:.1}s",
        jaeger.otlp_endpoint,
        started.elapsed().as_secs_f64()
    );

    // The demo flushed before it exited; Jaeger stores what it received within its batch
    // timeout. Wait (bounded) for the trace whose root is the demo's build.
    let path = format!("/api/traces?service={service}&limit=50");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (raw, trace) = loop {
        let answer = get(&jaeger.query_url, &path).unwrap();
        let found = answer["data"].as_array().and_then(|traces| {
            traces
                .iter()
                .find(|t| {
                    spans_of(t)
                        .iter()
                        .any(|s| s.name == "build" && s.parent.is_none())
                })
                .cloned()
        });
        if let Some(trace) = found {
            // Every span of the build has arrived once the merge stage has.
            if spans_of(&trace).iter().any(|s| s.name == "stage.merge") {
                break (answer.to_string(), trace);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no complete trace of service {service} in Jaeger within 60 s: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let spans = spans_of(&trace);
    eprintln!("trace {}: {} spans", trace["traceID"], spans.len());

    // One root: the build attempt, with the item and its fencing token as attributes.
    let roots: Vec<&Span> = spans.iter().filter(|s| s.parent.is_none()).collect();
    assert_eq!(roots.len(), 1, "one root per trace: {roots:?}");
    let build = roots[0];
    assert_eq!(build.name, "build");
    assert_eq!(build.tag("work_item"), work_item);
    assert!(
        !build.tag("fencing_token").is_empty(),
        "the build span carries the fencing token: {build:?}"
    );

    // Under it, in order: the cycles, then inspection, then merge.
    let top = children(&spans, build);
    let stages: Vec<&str> = top
        .iter()
        .map(|s| s.name.as_str())
        .filter(|n| *n != "effect.command")
        .collect();
    let cycles = report["cycles"].as_array().unwrap().len();
    let mut expected = vec!["cycle"; cycles];
    expected.extend(["stage.inspection", "stage.merge"]);
    assert_eq!(stages, expected, "the build's stages in order");
    let cycle_spans = named(&top, "cycle");
    for (n, cycle) in cycle_spans.iter().enumerate() {
        assert_eq!(cycle.tag("cycle"), (n + 1).to_string());
        let inner = children(&spans, cycle);
        let names: Vec<&str> = inner.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "stage.worker_a",
                "stage.worker_b",
                "stage.integration_gate",
                "stage.triage"
            ],
            "cycle {} (Worker A and Worker B start together, then the gate, then triage)",
            n + 1
        );
        let (a, b, gate, triage) = (inner[0], inner[1], inner[2], inner[3]);
        assert!(
            gate.start >= a.end.max(b.end),
            "the gate runs after both Workers"
        );
        assert!(triage.start >= gate.end, "triage follows the gate");
        let decision = report["cycles"][n]["decision"].as_str().unwrap();
        let decision = if decision == "pass" {
            "passed"
        } else {
            decision
        };
        assert_eq!(triage.tag("decision"), decision, "cycle {}", n + 1);
    }
    for pair in top.windows(2) {
        assert!(pair[1].start >= pair[0].start);
    }

    // Each sandbox run sits under the stage whose role it ran.
    let runs: Vec<&Span> = spans.iter().filter(|s| s.name == "sandbox.run").collect();
    let by_id: HashMap<&str, &Span> = spans.iter().map(|s| (s.id.as_str(), s)).collect();
    let inspections = report["inspections"].as_array().unwrap().len();
    assert!(
        runs.len() > 3 * cycles,
        "three runs per cycle and the inspection's: {runs:?}"
    );
    for run in &runs {
        let stage = by_id[run.parent.as_deref().unwrap()];
        let expected = match run.tag("role") {
            "worker-a" => "stage.worker_a",
            "worker-b" => "stage.worker_b",
            "integration-runner" => "stage.integration_gate",
            "inspector" | "mutation-runner" => "stage.inspection",
            other => panic!("a sandbox run of an unknown role {other}: {run:?}"),
        };
        assert_eq!(stage.name, expected, "{run:?}");
        assert_eq!(run.tag("work_item"), work_item);
        assert!(!run.tag("run_id").is_empty());
        assert!(run.tag("termination").contains("Exited"), "{:?}", run.tags);
    }
    for stage in ["stage.worker_a", "stage.worker_b", "stage.integration_gate"] {
        for s in spans.iter().filter(|s| s.name == stage) {
            assert_eq!(
                children(&spans, s)
                    .iter()
                    .filter(|c| c.name == "sandbox.run")
                    .count(),
                1,
                "one sandbox run per {stage}"
            );
        }
    }
    let inspection = named(&top, "stage.inspection")[0];
    assert!(
        children(&spans, inspection)
            .iter()
            .filter(|c| c.name == "sandbox.run")
            .count()
            >= inspections,
        "the Inspector ran under the inspection stage"
    );
    // The fenced commands are effects of the build, the last one the merge's record.
    let commands: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "effect.command")
        .collect();
    assert!(
        commands.iter().all(|c| c.tag("ok") == "true"),
        "{commands:?}"
    );
    assert!(
        commands.iter().any(|c| c.tag("command") == "record-merge"),
        "{commands:?}"
    );

    // Nothing a Worker read or wrote: no requirement text, no feedback text, no stderr.
    for (id, _, text) in protobot_demo::example::REQUIREMENTS {
        assert!(!raw.contains(text), "requirement {id}'s text was exported");
    }
    let mut feedback_texts = 0;
    for cycle in report["cycles"].as_array().unwrap() {
        for feedback in cycle["feedback"].as_array().into_iter().flatten() {
            for key in ["reason", "request"] {
                if let Some(text) = feedback[key].as_str().filter(|t| t.len() > 12) {
                    feedback_texts += 1;
                    assert!(!raw.contains(text), "feedback text was exported: {text}");
                }
            }
        }
    }
    assert!(
        feedback_texts > 0,
        "the demo's first cycle sends Worker B feedback: {report}"
    );
    assert!(!raw.contains("stderr"), "a Worker's stderr was exported");
}
