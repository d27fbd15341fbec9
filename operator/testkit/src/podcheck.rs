//! Minimal Pod spec validation, the subset that catches malformed pods a
//! controller might build: containers present, each with a unique DNS-label
//! name and an image, volume mounts naming declared volumes (with a relative
//! `subPath` that does not climb out with `..`), and a known `restartPolicy`.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::error::Cause;

fn required(field: String) -> Cause {
    Cause {
        reason: "FieldValueRequired".to_owned(),
        message: "Required value".to_owned(),
        field,
    }
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A `subPath` the API server accepts: relative, no `..` element.
pub(crate) fn sub_path_ok(sub: &str) -> bool {
    !sub.starts_with('/') && !sub.split('/').any(|part| part == "..")
}

/// Field errors of a pod's spec.
pub fn check(pod: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(spec) = pod.get("spec") else {
        causes.push(required("spec.containers".to_owned()));
        return causes;
    };
    let volumes: BTreeSet<&str> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .map(|v| {
            v.iter()
                .filter_map(|v| v.get("name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    let containers = spec.get("containers").and_then(Value::as_array);
    if containers.is_none_or(|c| c.is_empty()) {
        causes.push(required("spec.containers".to_owned()));
    }
    let mut names = BTreeSet::new();
    for list in ["initContainers", "containers"] {
        for (i, c) in spec
            .get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let at = format!("spec.{list}[{i}]");
            match c.get("name").and_then(Value::as_str) {
                None | Some("") => causes.push(required(format!("{at}.name"))),
                Some(name) if !dns_label(name) => causes.push(Cause {
                    reason: "FieldValueInvalid".to_owned(),
                    message: format!("Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"),
                    field: format!("{at}.name"),
                }),
                Some(name) if !names.insert(name.to_owned()) => causes.push(Cause {
                    reason: "FieldValueDuplicate".to_owned(),
                    message: format!("Duplicate value: {name:?}"),
                    field: format!("{at}.name"),
                }),
                Some(_) => {}
            }
            if c.get("image")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                causes.push(required(format!("{at}.image")));
            }
            for (j, m) in c
                .get("volumeMounts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let name = m.get("name").and_then(Value::as_str).unwrap_or("");
                if !volumes.contains(name) {
                    causes.push(Cause {
                        reason: "FieldValueNotFound".to_owned(),
                        message: format!("Not found: {name:?}"),
                        field: format!("{at}.volumeMounts[{j}].name"),
                    });
                }
                if let Some(sub) = m.get("subPath").and_then(Value::as_str)
                    && !sub_path_ok(sub)
                {
                    causes.push(Cause {
                        reason: "FieldValueInvalid".to_owned(),
                        message: format!(
                            "Invalid value: {sub:?}: must be a relative path without '..'"
                        ),
                        field: format!("{at}.volumeMounts[{j}].subPath"),
                    });
                }
            }
        }
    }
    if let Some(policy) = spec.get("restartPolicy").and_then(Value::as_str)
        && !matches!(policy, "Always" | "OnFailure" | "Never")
    {
        causes.push(Cause {
            reason: "FieldValueNotSupported".to_owned(),
            message: format!("Unsupported value: {policy:?}: supported values: \"Always\", \"OnFailure\", \"Never\""),
            field: "spec.restartPolicy".to_owned(),
        });
    }
    causes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn malformed_pods_are_reported_per_field() {
        let pod = json!({"spec": {"restartPolicy": "Sometimes", "containers": [
            {"name": "a", "image": "x", "volumeMounts": [{"name": "missing", "mountPath": "/m"}, {"name": "missing", "mountPath": "/n", "subPath": "a/../../etc"}]},
            {"name": "a"},
            {"name": "Bad_Name", "image": "x"}
        ]}});
        let fields: Vec<String> = check(&pod).into_iter().map(|c| c.field).collect();
        assert_eq!(
            fields,
            [
                "spec.containers[0].volumeMounts[0].name",
                "spec.containers[0].volumeMounts[1].name",
                "spec.containers[0].volumeMounts[1].subPath",
                "spec.containers[1].name",
                "spec.containers[1].image",
                "spec.containers[2].name",
                "spec.restartPolicy"
            ]
        );
        assert_eq!(check(&json!({"spec": {}}))[0].field, "spec.containers");
    }
}
