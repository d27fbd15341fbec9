//! The manifests of `docs/examples/` are valid objects: one per kind, each deserializes into
//! its Rust type, survives a round trip unchanged (a field the type does not know would be
//! dropped), and validates against the generated CRD schema (unknown fields, patterns,
//! bounds). A broken copy of each example is refused, so the check is not vacuous.

use std::path::{Path, PathBuf};

use protobot_api::{BugReport, BuildWorkItem, ChangeSet, InspectionRun, Project};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::util::{root_schema, validate};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples")
}

/// Every example as `(file, JSON)`; each file holds one document.
fn examples() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let value: Value = serde_yaml_ng::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
            (path.display().to_string(), value)
        })
        .collect()
}

/// What is wrong with `object` as a `K` of `kind`.
fn problems<K>(kind: &str, object: &Value) -> Vec<String>
where
    K: Serialize + DeserializeOwned,
{
    let typed: K = match serde_json::from_value(object.clone()) {
        Ok(t) => t,
        Err(e) => return vec![format!("does not deserialize as {kind}: {e}")],
    };
    let mut out = Vec::new();
    let back = serde_json::to_value(&typed).unwrap();
    if back["spec"] != object["spec"] {
        out.push(format!(
            "spec changes in a round trip through the Rust type (unknown or defaulted field): {} became {}",
            object["spec"], back["spec"]
        ));
    }
    let schema = root_schema(kind);
    out.extend(validate(
        &schema["properties"]["spec"],
        &object["spec"],
        "spec",
    ));
    if object["apiVersion"] != "protobot.dev/v1alpha1" {
        out.push(format!("apiVersion is {}", object["apiVersion"]));
    }
    for field in ["name", "namespace"] {
        if !object["metadata"][field].is_string() {
            out.push(format!("metadata.{field} is missing"));
        }
    }
    out
}

fn check(kind: &str, object: &Value) -> Vec<String> {
    match kind {
        "Project" => problems::<Project>(kind, object),
        "ChangeSet" => problems::<ChangeSet>(kind, object),
        "BugReport" => problems::<BugReport>(kind, object),
        "BuildWorkItem" => problems::<BuildWorkItem>(kind, object),
        "InspectionRun" => problems::<InspectionRun>(kind, object),
        other => vec![format!("{other} is not a protobot kind")],
    }
}

#[test]
fn every_kind_has_an_example_and_every_example_is_valid() {
    let examples = examples();
    let mut kinds: Vec<&str> = examples
        .iter()
        .map(|(_, v)| v["kind"].as_str().unwrap_or("?"))
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "BugReport",
            "BuildWorkItem",
            "ChangeSet",
            "InspectionRun",
            "Project"
        ],
        "one example per kind in docs/examples/"
    );
    for (file, object) in &examples {
        let kind = object["kind"].as_str().unwrap();
        let found = check(kind, object);
        assert!(found.is_empty(), "{file}:\n{}", found.join("\n"));
    }
}

#[test]
fn a_broken_example_is_refused() {
    for (file, object) in examples() {
        let kind = object["kind"].as_str().unwrap().to_string();
        let mut typo = object.clone();
        let spec = typo["spec"].as_object_mut().unwrap();
        let (first, value) = spec
            .iter()
            .next()
            .map(|(k, v)| (k.clone(), v.clone()))
            .unwrap();
        spec.remove(&first);
        spec.insert(format!("{first}X"), value);
        assert!(
            !check(&kind, &typo).is_empty(),
            "{file}: a misspelt field passed"
        );
    }
    let (_, project) = examples()
        .into_iter()
        .find(|(_, v)| v["kind"] == "Project")
        .unwrap();
    let mut bounds = project.clone();
    bounds["spec"]["wipLimit"] = Value::from(100_000);
    bounds["spec"]["leaseDurationSeconds"] = Value::from(5);
    let found = check("Project", &bounds);
    assert!(
        found
            .iter()
            .any(|p| p.contains("wipLimit") && p.contains("maximum")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.contains("leaseDurationSeconds") && p.contains("minimum")),
        "{found:?}"
    );
    let mut branch = project;
    branch["spec"]["defaultBranch"] = Value::from("-main");
    assert!(
        check("Project", &branch)
            .iter()
            .any(|p| p.contains("defaultBranch")),
        "a branch starting with '-' passed the pattern"
    );
}
