//! The demo's usage (issue 34), checked against the model double's own count: shared by the
//! OpenCode and Claude Code demo tests.

/// What the egress proxy metered for the demo's item (`report["usage"]`) equals what the model
/// double's answers reported by its own count (`report["model"]["served"]`), and the demo's
/// prices ($3 in, $15 out per million tokens) make each answer's 10 in and 10 out cost 180
/// micro-dollars.
pub fn assert_metered_equals_the_doubles_count(report: &serde_json::Value) {
    let served = &report["model"]["served"];
    let answers = served["answers"].as_u64().unwrap();
    assert!(answers > 0, "{served}");
    let total = &report["usage"]["total"];
    assert_eq!(total["calls"].as_u64(), Some(answers), "{total}");
    assert_eq!(total["tokens"]["input"], served["input_tokens"], "{total}");
    assert_eq!(
        total["tokens"]["output"], served["output_tokens"],
        "{total}"
    );
    assert_eq!(total["callsWithoutUsage"].as_u64(), Some(0), "{total}");
    assert_eq!(total["unpricedCalls"].as_u64(), Some(0), "{total}");
    assert_eq!(
        total["costMicrodollars"].as_u64(),
        Some(answers * 180),
        "{total}"
    );
    let stages: Vec<&String> = report["usage"]["by_stage"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(stages, ["inspection", "worker-a", "worker-b"], "{report}");
}
