//! The corpus's rules for a result record beyond its JSON schema (the
//! upstream `validate.py`'s semantic checks, restated from the contract):
//! the schema cannot express that a critical failure forbids a passing
//! stage, that counts add up, or that the stage and the projection match.
//! The schema itself is checked by the real validator (`check-jsonschema`).

use crate::schema::{
    CheckCounts, Mode, Projection, ResultRecord, SCHEMA_VERSION, Stage, is_identifier,
};

/// Every rule `record` breaks, in words (empty when it keeps them all).
pub fn violations(record: &ResultRecord) -> Vec<String> {
    let mut out = Vec::new();
    let r = record;
    if r.schema_version != SCHEMA_VERSION {
        out.push(format!(
            "schema_version {} is not {SCHEMA_VERSION}",
            r.schema_version
        ));
    }
    for (field, id) in [("result_id", &r.result_id), ("fixture_id", &r.fixture_id)] {
        if !is_identifier(id) {
            out.push(format!("{field} {id:?} is not an identifier"));
        }
    }
    if !is_timestamp(&r.recorded_at) {
        out.push(format!(
            "recorded_at {:?} is not YYYY-MM-DDTHH:MM:SSZ",
            r.recorded_at
        ));
    }
    let inputs = &r.reproducibility.inputs;
    if inputs.fixture_id != r.fixture_id {
        out.push(format!(
            "fixture_id {} differs from reproducibility.inputs.fixture_id {}",
            r.fixture_id, inputs.fixture_id
        ));
    }
    if inputs.corpus_revision != r.corpus_revision {
        out.push(format!(
            "corpus_revision {} differs from reproducibility.inputs.corpus_revision {}",
            r.corpus_revision, inputs.corpus_revision
        ));
    }
    let expected = match r.stage {
        Stage::Requirements => Projection::ElicitationInput,
        Stage::JobSite => Projection::JobSiteInput,
        Stage::EndToEnd => Projection::EndToEnd,
    };
    if inputs.projection != expected {
        out.push(format!(
            "stage {:?} needs projection {expected:?}, not {:?}",
            r.stage, inputs.projection
        ));
    }
    let env = &r.reproducibility.environment;
    if env.mode == Mode::Local && (env.hosted_cluster || env.external_service_credentials) {
        out.push("local mode claims a hosted cluster or external service credentials".into());
    }
    if env.components.is_empty() {
        out.push("environment.components is empty".into());
    }
    let s = &r.scores;
    let (req, js, e2e) = (
        s.requirements.is_some(),
        s.job_site.is_some(),
        s.end_to_end.is_some(),
    );
    let gated = match r.stage {
        Stage::Requirements => req && !js && !e2e,
        Stage::JobSite => js && !req && !e2e,
        Stage::EndToEnd => req && js && e2e,
    };
    if !gated {
        out.push(format!("stage {:?} carries the wrong scores", r.stage));
    }
    let passes = [
        s.requirements.as_ref().map(|x| x.pass),
        s.job_site.as_ref().map(|x| x.pass),
        s.end_to_end.as_ref().map(|x| x.pass),
    ];
    if !r.critical_failures.is_empty() && passes.contains(&Some(true)) {
        out.push(format!(
            "{} critical failures but a stage passes",
            r.critical_failures.len()
        ));
    }
    if let Some(j) = &s.job_site {
        for (name, c) in [
            ("visible_checks", j.visible_checks),
            ("holdout_checks", j.holdout_checks),
        ] {
            let CheckCounts {
                passed,
                failed,
                total,
            } = c;
            if passed.checked_add(failed) != Some(total) {
                out.push(format!(
                    "job_site.{name}: {passed} passed + {failed} failed is not {total}"
                ));
            }
        }
        if j.pass && j.holdout_checks.failed > 0 {
            out.push("job_site passes with a failed holdout check".into());
        }
    }
    if let Some(e) = &s.end_to_end {
        let stage_pass = (
            s.requirements.as_ref().map(|x| x.pass),
            s.job_site.as_ref().map(|x| x.pass),
        );
        if stage_pass
            != (
                Some(e.attribution.requirements),
                Some(e.attribution.job_site),
            )
        {
            out.push("end_to_end.attribution does not restate the stage passes".into());
        }
    }
    for f in r.failures.iter().chain(&r.critical_failures) {
        if f.detail.is_empty() || f.evidence.is_empty() {
            out.push("a failure has an empty detail or evidence".into());
        }
    }
    out
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
pub fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 20
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// `ts` as the schema writes it (UTC, whole seconds).
pub fn timestamp(ts: jiff::Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_whole_utc_seconds() {
        let ts: jiff::Timestamp = "2026-12-02T18:41:19.734+02:00".parse().unwrap();
        assert_eq!(timestamp(ts), "2026-12-02T16:41:19Z");
        assert!(is_timestamp("2026-09-29T00:00:00Z"));
        for bad in [
            "2026-09-29T00:00:00",
            "2026-09-29 00:00:00Z",
            "2026-09-29T00:00:00.1Z",
            "",
        ] {
            assert!(!is_timestamp(bad), "{bad}");
        }
    }
}
