#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The operator image has two recipes: the top-level `Dockerfile` (users with registries) and
//! `scripts/node-images operator` (this machine, nothing pulled; the real node's image). They
//! must give the same image layout: the binary's path, the entrypoint, the command and the
//! user, and that path is the one the sandbox profiles' supervisor copies out of the image.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The Dockerfile's runtime stage: the lines after the last `FROM`.
fn runtime_stage(dockerfile: &str) -> Vec<&str> {
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).collect();
    let last_from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("the Dockerfile has a FROM");
    lines[last_from..].to_vec()
}

/// The value of a JSON-array instruction (`ENTRYPOINT ["a"]`) as its elements.
fn exec_form(stage: &[&str], instruction: &str) -> Vec<String> {
    let line = stage
        .iter()
        .find_map(|l| l.strip_prefix(&format!("{instruction} ")))
        .unwrap_or_else(|| panic!("the runtime stage has no {instruction}"));
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{instruction} {line}: not exec form: {e}"))
}

/// `NAME=value` assignments at the top of `scripts/node-images`.
fn script_value(script: &str, name: &str) -> String {
    script
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("scripts/node-images sets no {name}"))
        .trim()
        .to_owned()
}

#[test]
fn the_dockerfile_and_the_node_image_recipe_give_the_same_layout() {
    let dockerfile = read("Dockerfile");
    let stage = runtime_stage(&dockerfile);
    let script = read("scripts/node-images");

    let copy = stage
        .iter()
        .find(|l| l.starts_with("COPY --from=build "))
        .expect("the runtime stage copies the binary from the build stage");
    let docker_binary = copy.split_whitespace().last().unwrap();
    let user = stage
        .iter()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the runtime stage sets USER");

    assert_eq!(script_value(&script, "IMAGE_BINARY"), docker_binary);
    assert_eq!(
        vec![script_value(&script, "IMAGE_ENTRYPOINT")],
        exec_form(&stage, "ENTRYPOINT")
    );
    assert_eq!(
        vec![script_value(&script, "IMAGE_CMD")],
        exec_form(&stage, "CMD")
    );
    assert_eq!(script_value(&script, "IMAGE_USER"), user.trim());
}

#[test]
fn the_supervisor_is_copied_from_where_both_recipes_put_the_binary() {
    let script = read("scripts/node-images");
    let binary = script_value(&script, "IMAGE_BINARY");
    for profile in ["sandbox-profiles/gvisor.yaml", "sandbox-profiles/kata.yaml"] {
        let text = read(profile);
        assert!(
            text.contains(&format!("binaryPath: {binary}")),
            "{profile}: the supervisor's binaryPath is not {binary}"
        );
    }
}

#[test]
fn the_chart_runs_the_image_as_its_user() {
    let script = read("scripts/node-images");
    let user = script_value(&script, "IMAGE_USER");
    let uid = user.split(':').next().unwrap();
    let deployment = read("charts/protobot/templates/deployment.yaml");
    assert!(
        deployment.contains(&format!("runAsUser: {uid}")),
        "the chart's Deployment does not run as uid {uid}, the image's user"
    );
}
