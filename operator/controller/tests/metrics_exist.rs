#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Monitoring that tells the truth: every metric an alert, a recording rule or a dashboard
//! panel of the chart names is exposed by the operator's `/metrics`.
//!
//! The registry and the admin server start as `protobot operator` starts them
//! (`operator::run`: `JobSiteMetrics::register` over the work-item cache, then
//! `admin::serve`), the endpoint is scraped over HTTP, and every expression of
//! `charts/protobot/alerts/*.yaml` and `charts/protobot/dashboards/*.json` (the files the
//! chart's PrometheusRule and dashboard ConfigMap embed verbatim) is checked against the
//! scrape: each `protobot_*` metric must be a family there (a histogram's `_bucket`, `_sum`
//! and `_count` included), each `label="value"` matcher on it must match an exposed sample
//! (label values start at zero, so this holds from the first scrape), and each recording-rule
//! name an expression uses must be recorded by a rule.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use kube::runtime::reflector;
use protobot_api::BuildWorkItem;
use protobot_controller::{
    admin::{Readiness, serve},
    metrics::JobSiteMetrics,
    operator::CachedStates,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/protobot")
}

/// One exposition of every family the chart's Prometheus scrapes: the operator's (the Job
/// Site's and the forge client's, registered as `operator::run` registers them) and the
/// egress proxy's (decisions, limits, model usage), served from one registry here. Families
/// whose label values are only known when their event happens (forge calls, model usage)
/// get one event each, so their names and labels are exposed as after the first event.
async fn scrape() -> String {
    let registry = prometheus::Registry::new();
    let (reader, _writer) = reflector::store::<BuildWorkItem>();
    let metrics = JobSiteMetrics::register(&registry, Arc::new(CachedStates(reader))).unwrap();
    // A project's queue is set by its first dispatch.
    metrics
        .items_queued
        .with_label_values(&["team-a/shop"])
        .set(0);
    let forge = protobot_forge::metrics::ForgeMetrics::register(&registry).unwrap();
    forge.call("merge-pull", protobot_forge::metrics::Outcome::Success);
    forge.waited("primary");
    forge.merge_retried("base-branch-modified");
    forge.checks_wait_ended(protobot_forge::metrics::ChecksWaitOutcome::Reported);
    let _egress = protobot_egress::metrics::EgressMetrics::register(&registry).unwrap();
    let usage = protobot_egress::meter::UsageMetrics::register(&registry).unwrap();
    usage
        .tokens
        .with_label_values(&["shop", "worker-b", "t1", "input"])
        .inc();
    usage
        .cost
        .with_label_values(&["shop", "worker-b", "t1"])
        .inc();
    usage
        .calls
        .with_label_values(&["shop", "worker-b", "t1", "openai-chat", "reported"])
        .inc();
    let (addr, task) = serve(
        "127.0.0.1:0".parse().unwrap(),
        registry,
        Readiness::default(),
    )
    .await
    .unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = String::new();
    stream.read_to_string(&mut buf).await.unwrap();
    task.abort();
    assert!(buf.starts_with("HTTP/1.1 200"), "{buf}");
    buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()
}

/// What one scrape exposes: family name → type, and every sample's name with its labels.
struct Exposition {
    families: BTreeMap<String, String>,
    samples: Vec<(String, BTreeMap<String, String>)>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let mut families = BTreeMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    families.insert(name.to_string(), kind.to_string());
                }
            } else if !line.starts_with('#') && !line.trim().is_empty() {
                let (name, labels) = match line.find('{') {
                    Some(open) => {
                        let close = line.rfind('}').unwrap();
                        (&line[..open], parse_labels(&line[open + 1..close]))
                    }
                    None => (line.split_whitespace().next().unwrap(), BTreeMap::new()),
                };
                samples.push((name.to_string(), labels));
            }
        }
        Exposition { families, samples }
    }

    /// The family a sample or metric name belongs to (`x_bucket` → `x` for a histogram).
    fn family_of(&self, metric: &str) -> Option<&str> {
        if let Some((name, _)) = self.families.get_key_value(metric) {
            return Some(name);
        }
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = metric.strip_suffix(suffix)?;
            match self.families.get_key_value(base) {
                Some((name, kind)) if kind == "histogram" || kind == "summary" => {
                    Some(name.as_str())
                }
                _ => None,
            }
        })
    }
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_string();
        let after = &rest[eq + 1..];
        let Some(open) = after.find('"') else { break };
        let value_start = &after[open + 1..];
        let close = value_start.find('"').unwrap_or(value_start.len());
        out.insert(key, value_start[..close].to_string());
        rest = value_start.get(close + 1..).unwrap_or("");
    }
    out
}

/// A metric an expression selects, with its equality matchers (`label="value"`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Selector {
    name: String,
    equal: Vec<(String, String)>,
}

/// PromQL's aggregation operators and keywords: words that are never metric names (an
/// aggregation may be followed by `by (...)` rather than by its parenthesis).
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
];

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Every metric name (a word of `[a-zA-Z_:][a-zA-Z0-9_:]*` not followed by `(`, outside
/// string literals) an expression names, with the equality matchers of its selector.
/// Function names, keywords and label names are words too; callers keep only the names
/// of metrics they own (`protobot_*`, recording rules).
fn selectors(expr: &str) -> Vec<Selector> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut depth_braces = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
            i += 1;
            continue;
        }
        if c == '{' {
            depth_braces += 1;
        } else if c == '}' {
            depth_braces -= 1;
        }
        if depth_braces == 0 && (c.is_ascii_alphabetic() || c == '_' || c == ':') {
            let start = i;
            while i < chars.len() && is_name_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            let mut equal = Vec::new();
            if j < chars.len() && chars[j] == '{' {
                let close = chars[j..].iter().position(|c| *c == '}').map(|p| j + p);
                let inner: String = chars[j + 1..close.unwrap_or(chars.len())].iter().collect();
                for part in inner.split(',') {
                    if let Some((k, v)) = part.split_once('=')
                        && !k.ends_with('!')
                        && !v.starts_with('~')
                    {
                        equal.push((k.trim().to_string(), v.trim().trim_matches('"').to_string()));
                    }
                }
                i = close.map_or(chars.len(), |c| c + 1);
            }
            let is_call = j < chars.len() && chars[j] == '(';
            if !is_call && !KEYWORDS.contains(&word.as_str()) {
                out.push(Selector { name: word, equal });
            }
            continue;
        }
        i += 1;
    }
    out
}

/// `(where, expr)` of every `expr:` and `(where, record)` of every `record:` in a rules file.
/// Block scalars (`expr: |`) are read to the end of their indentation.
fn rule_exprs(path: &Path) -> (Vec<(String, String)>, BTreeSet<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut exprs = Vec::new();
    let mut records = BTreeSet::new();
    let mut current = String::from("?");
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        let indent = lines[i].len() - line.len();
        let field = line.strip_prefix("- ").unwrap_or(line);
        if let Some(name) = field.strip_prefix("alert:") {
            current = format!("alert {}", name.trim());
        } else if let Some(name) = field.strip_prefix("record:") {
            current = format!("recording rule {}", name.trim());
            records.insert(name.trim().to_string());
        } else if let Some(value) = field.strip_prefix("expr:") {
            let value = value.trim();
            let expr = if value.starts_with('|') || value.starts_with('>') {
                let mut block = Vec::new();
                while i + 1 < lines.len()
                    && (lines[i + 1].trim().is_empty()
                        || lines[i + 1].len() - lines[i + 1].trim_start().len() > indent)
                {
                    i += 1;
                    block.push(lines[i].trim());
                }
                block.join(" ")
            } else {
                value.trim_matches(|c| c == '\'' || c == '"').to_string()
            };
            exprs.push((format!("{} ({current})", path.display()), expr));
        }
        i += 1;
    }
    (exprs, records)
}

fn dashboard_exprs(path: &Path, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => {
                        let title = map
                            .get("title")
                            .and_then(|t| t.as_str())
                            .unwrap_or("a panel target");
                        out.push((format!("{} ({title})", path.display()), e.clone()));
                    }
                    (_, v) => dashboard_exprs(path, v, out),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                dashboard_exprs(path, v, out);
            }
        }
        _ => {}
    }
}

/// Every expression of the chart's rules and dashboards, and the recording rules' names.
fn chart_exprs() -> (Vec<(String, String)>, BTreeSet<String>) {
    let mut exprs = Vec::new();
    let mut records = BTreeSet::new();
    let files = |dir: &str, ext: &str| {
        let mut found: Vec<PathBuf> = std::fs::read_dir(chart().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect();
        found.sort();
        found
    };
    for path in files("alerts", "yaml") {
        let (e, r) = rule_exprs(&path);
        exprs.extend(e);
        records.extend(r);
    }
    for path in files("dashboards", "json") {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut panel_exprs = Vec::new();
        dashboard_exprs(&path, &json, &mut panel_exprs);
        assert!(
            !panel_exprs.is_empty(),
            "{} has no expressions",
            path.display()
        );
        exprs.extend(panel_exprs);
    }
    (exprs, records)
}

/// What is wrong with `exprs` against `scrape`: one line per missing metric or series.
fn problems(
    exprs: &[(String, String)],
    records: &BTreeSet<String>,
    scrape: &Exposition,
) -> Vec<String> {
    let mut out = Vec::new();
    for (place, expr) in exprs {
        for sel in selectors(expr) {
            if sel.name.contains(':') {
                if !records.contains(&sel.name) {
                    out.push(format!(
                        "{place}: {} is not recorded by any recording rule",
                        sel.name
                    ));
                }
                continue;
            }
            if !sel.name.starts_with("protobot_") {
                continue;
            }
            let Some(family) = scrape.family_of(&sel.name) else {
                out.push(format!(
                    "{place}: {} is not exposed by the operator's /metrics; record it where its event happens or remove it from the expression",
                    sel.name
                ));
                continue;
            };
            // `job`, `namespace`, `instance`, `pod` are the scrape's target labels.
            let wanted: Vec<_> = sel
                .equal
                .iter()
                .filter(|(k, _)| {
                    !["job", "namespace", "instance", "pod", "service"].contains(&k.as_str())
                })
                .collect();
            let matched = scrape.samples.iter().any(|(name, labels)| {
                scrape.family_of(name) == Some(family)
                    && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
            });
            if !matched {
                out.push(format!(
                    "{place}: no sample of {family} has {wanted:?}; start the label value at zero in JobSiteMetrics::register or fix the matcher"
                ));
            }
        }
    }
    out
}

#[tokio::test]
async fn every_metric_the_chart_names_is_exposed_by_the_operator() {
    let scrape = Exposition::parse(&scrape().await);
    let (exprs, records) = chart_exprs();
    assert!(
        exprs.iter().filter(|(p, _)| p.contains("alert ")).count() >= 6,
        "the rules were not read: {exprs:?}"
    );
    let found = problems(&exprs, &records, &scrape);
    assert!(
        found.is_empty(),
        "the chart names metrics the operator does not expose:\n{}",
        found.join("\n")
    );
}

#[tokio::test]
async fn an_alert_on_an_unrecorded_metric_is_reported() {
    let scrape = Exposition::parse(&scrape().await);
    let records = BTreeSet::from(["namespace_job_state:protobot_work_items:max".to_string()]);
    let exprs = vec![
        (
            "alert Unrecorded".to_string(),
            "increase(protobot_mutation_survivors_total[1h]) > 0".to_string(),
        ),
        (
            "alert WrongLabel".to_string(),
            r#"increase(protobot_merges_total{outcome="verify_failed"}[30m]) > 0"#.to_string(),
        ),
        (
            "alert NoSuchRecord".to_string(),
            "sum(job:protobot_work_items:sum) > 0".to_string(),
        ),
        (
            "panel Fine".to_string(),
            r#"histogram_quantile(0.9, sum by (le) (rate(protobot_triage_cycles_bucket{job="x"}[1h])))"#
                .to_string(),
        ),
    ];
    let found = problems(&exprs, &records, &scrape);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(found[0].contains("protobot_mutation_survivors_total is not exposed"));
    assert!(found[1].contains("no sample of protobot_merges_total"));
    assert!(found[2].contains("job:protobot_work_items:sum is not recorded"));
}

#[test]
fn selectors_skip_functions_strings_and_label_names() {
    let found = selectors(
        r#"sum by (namespace, state) (max without (pod) (protobot_work_items{state="blocked", job!="x"})) > 0 and on() up{job="p"} == 0"#,
    );
    let names: Vec<&str> = found.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"protobot_work_items"), "{names:?}");
    assert!(names.contains(&"up"));
    let work_items = found
        .iter()
        .find(|s| s.name == "protobot_work_items")
        .unwrap();
    assert_eq!(
        work_items.equal,
        vec![("state".to_string(), "blocked".to_string())]
    );
    assert!(!names.contains(&"sum") && !names.contains(&"max"));
}

/// Every dashboard a platform team opens answers "what do I do now" and follows the chosen
/// data source and namespace: each panel has a description, reads `${datasource}`, and each
/// query on the operator's families filters on `$namespace`; the variables exist.
#[test]
fn every_dashboard_panel_says_what_to_do_and_follows_its_variables() {
    let mut dashboards = 0;
    for entry in std::fs::read_dir(chart().join("dashboards")).unwrap() {
        let path = entry.unwrap().path();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        dashboards += 1;
        let variables: BTreeSet<&str> = json["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert!(
            variables.contains("datasource") && variables.contains("namespace"),
            "{}: variables {variables:?}",
            path.display()
        );
        let panels = json["panels"].as_array().unwrap();
        assert!(
            panels.len() >= 8,
            "{}: {} panels",
            path.display(),
            panels.len()
        );
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or("?");
            let place = format!("{} ({title})", path.display());
            assert!(
                panel["description"].as_str().is_some_and(|d| d.len() > 40),
                "{place}: no description saying what to do"
            );
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{place}");
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                assert_eq!(target["datasource"]["uid"], "${datasource}", "{place}");
                let selected = selectors(expr);
                let filtered = selected
                    .iter()
                    .filter(|s| s.name.starts_with("protobot_") || s.name.contains(':'))
                    .all(|_| {
                        expr.contains("namespace=~\"$namespace\"")
                            || expr.contains("project=~\"$project\"")
                    });
                assert!(
                    filtered,
                    "{place}: `{expr}` ignores the namespace/project variable"
                );
            }
        }
    }
    assert_eq!(
        dashboards, 3,
        "overview, build pipeline, sandboxes and egress"
    );
}
