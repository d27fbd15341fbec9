//! Server-side apply and patches: field managers in managedFields, conflicts that
//! name the other manager, `force`, field removal, merge and JSON patches.

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::{Widget, cms, config_map, server, status_of};

fn widget_apply(image: Option<&str>, replicas: Option<i64>) -> serde_json::Value {
    let mut spec = json!({});
    if let Some(i) = image {
        spec["image"] = json!(i);
    }
    if let Some(r) = replicas {
        spec["replicas"] = json!(r);
    }
    json!({"apiVersion": "testkit.example.com/v1", "kind": "Widget", "metadata": {"name": "ssa"}, "spec": spec})
}

#[tokio::test]
async fn ssa_conflicts_report_the_other_manager_and_force_takes_over() {
    let server = server();
    let api: Api<Widget> = Api::default_namespaced(server.client());
    let alice = PatchParams::apply("alice");
    let created = api
        .patch(
            "ssa",
            &alice,
            &Patch::Apply(widget_apply(Some("img:1"), Some(3))),
        )
        .await
        .unwrap();
    assert_eq!(created.spec.replicas, Some(3));
    let managers: Vec<String> = created
        .metadata
        .managed_fields
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m.manager.clone().unwrap(),
                m.operation.clone().unwrap()
            )
        })
        .collect();
    assert_eq!(managers, ["alice/Apply"]);

    let bob = PatchParams::apply("bob");
    let s = status_of(
        api.patch(
            "ssa",
            &bob,
            &Patch::Apply(widget_apply(Some("img:1"), Some(5))),
        )
        .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        s.message,
        "Apply failed with 1 conflict: conflict with \"alice\": .spec.replicas"
    );
    let cause = &s.details.unwrap().causes[0];
    assert_eq!(
        (cause.reason.as_str(), cause.field.as_str()),
        ("FieldManagerConflict", ".spec.replicas")
    );

    let forced = api
        .patch(
            "ssa",
            &bob.clone().force(),
            &Patch::Apply(widget_apply(Some("img:1"), Some(5))),
        )
        .await
        .unwrap();
    assert_eq!(forced.spec.replicas, Some(5));
    // alice no longer owns replicas: she can drop it from her config without removing it.
    let after = api
        .patch(
            "ssa",
            &alice,
            &Patch::Apply(widget_apply(Some("img:1"), None)),
        )
        .await
        .unwrap();
    assert_eq!(after.spec.replicas, Some(5));
}

#[tokio::test]
async fn ssa_removes_fields_a_manager_stops_applying() {
    let server = server();
    let api = cms(&server);
    let pp = PatchParams::apply("ctrl");
    let cm = |data: serde_json::Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned"}, "data": data});
    api.patch("owned", &pp, &Patch::Apply(cm(json!({"a": "1", "b": "2"}))))
        .await
        .unwrap();
    let after = api
        .patch("owned", &pp, &Patch::Apply(cm(json!({"a": "1"}))))
        .await
        .unwrap();
    assert_eq!(after.data.unwrap().keys().collect::<Vec<_>>(), ["a"]);
}

#[tokio::test]
async fn apply_without_field_manager_is_rejected() {
    let server = server();
    let api = cms(&server);
    let s = status_of(
        api.patch(
            "x",
            &PatchParams::default(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
            ),
        )
        .await,
    );
    assert_eq!(s.code, 400);
}

#[tokio::test]
async fn updates_move_field_ownership_to_the_updater() {
    let server = server();
    let api = cms(&server);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mv"}, "data": {"k": "v"}});
    api.patch("mv", &PatchParams::apply("applier"), &Patch::Apply(cm))
        .await
        .unwrap();
    let pp = PatchParams {
        field_manager: Some("editor".into()),
        ..PatchParams::default()
    };
    api.patch("mv", &pp, &Patch::Merge(json!({"data": {"k": "edited"}})))
        .await
        .unwrap();
    // The applier now conflicts with the editor on data.k.
    let s = status_of(
        api.patch(
            "mv",
            &PatchParams::apply("applier"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mv"}, "data": {"k": "v"}})),
        )
        .await,
    );
    assert!(
        s.message.contains("conflict with \"editor\""),
        "{}",
        s.message
    );
}

#[tokio::test]
async fn merge_and_json_patches_apply_and_respect_resource_version_preconditions() {
    let server = server();
    let api = cms(&server);
    let c = api
        .create(&PostParams::default(), &config_map("p", &[("a", "1")]))
        .await
        .unwrap();
    let merged = api
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"b": "2", "a": null}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.data.clone().unwrap().keys().collect::<Vec<_>>(),
        ["b"]
    );
    let stale =
        json!({"metadata": {"resourceVersion": c.metadata.resource_version}, "data": {"c": "3"}});
    assert_eq!(
        status_of(
            api.patch("p", &PatchParams::default(), &Patch::Merge(stale))
                .await
        )
        .code,
        409
    );
    let ops: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/data/z", "value": "26"}])).unwrap();
    let patched = api
        .patch("p", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["z"], "26");
}

#[tokio::test]
async fn ssa_on_the_status_subresource_touches_only_status() {
    let server = server();
    let api: Api<Widget> = Api::default_namespaced(server.client());
    api.patch(
        "ssa",
        &PatchParams::apply("alice"),
        &Patch::Apply(widget_apply(Some("img:1"), None)),
    )
    .await
    .unwrap();
    let status = json!({
        "apiVersion": "testkit.example.com/v1", "kind": "Widget", "metadata": {"name": "ssa"},
        "spec": {"image": "ignored"}, "status": {"phase": "Ready"}
    });
    let after = api
        .patch_status(
            "ssa",
            &PatchParams::apply("status-writer"),
            &Patch::Apply(status),
        )
        .await
        .unwrap();
    assert_eq!(after.spec.image, "img:1");
    assert_eq!(after.status.unwrap().phase.as_deref(), Some("Ready"));
    let entry = after
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|m| m.manager.as_deref() == Some("status-writer"))
        .unwrap();
    assert_eq!(entry.subresource.as_deref(), Some("status"));
}

#[tokio::test]
async fn map_and_set_lists_merge_per_element_across_managers() {
    let server = server();
    let api: Api<Widget> = Api::default_namespaced(server.client());
    api.patch(
        "ssa",
        &PatchParams::apply("alice"),
        &Patch::Apply(widget_apply(Some("img:1"), None)),
    )
    .await
    .unwrap();
    let condition = |ty: &str, status: &str| {
        json!({
            "apiVersion": "testkit.example.com/v1", "kind": "Widget", "metadata": {"name": "ssa"},
            "status": {"conditions": [{"type": ty, "status": status}]}
        })
    };
    // Two controllers own one condition each (x-kubernetes-list-type: map, key type).
    api.patch_status(
        "ssa",
        &PatchParams::apply("ready-ctl"),
        &Patch::Apply(condition("Ready", "True")),
    )
    .await
    .unwrap();
    api.patch_status(
        "ssa",
        &PatchParams::apply("synced-ctl"),
        &Patch::Apply(condition("Synced", "False")),
    )
    .await
    .unwrap();
    // The typed Widget has no conditions field: read the stored object.
    let raw = server
        .object("testkit.example.com", "widgets", "default", "ssa")
        .unwrap();
    assert_eq!(
        raw["status"]["conditions"].as_array().unwrap().len(),
        2,
        "{raw}"
    );
    // Changing someone else's condition conflicts and names the element.
    let s = status_of(
        api.patch_status(
            "ssa",
            &PatchParams::apply("synced-ctl"),
            &Patch::Apply(condition("Ready", "False")),
        )
        .await,
    );
    assert!(
        s.message
            .contains("conflict with \"ready-ctl\": .status.conditions[type=\"Ready\"].status"),
        "{}",
        s.message
    );

    // metadata.finalizers is a set: each manager adds its own.
    let fin = |f: &str| json!({"apiVersion": "testkit.example.com/v1", "kind": "Widget", "metadata": {"name": "ssa", "finalizers": [f]}});
    api.patch(
        "ssa",
        &PatchParams::apply("fin-a"),
        &Patch::Apply(fin("a.example/x")),
    )
    .await
    .unwrap();
    let w = api
        .patch(
            "ssa",
            &PatchParams::apply("fin-b"),
            &Patch::Apply(fin("b.example/y")),
        )
        .await
        .unwrap();
    assert_eq!(
        w.metadata.finalizers.unwrap(),
        ["a.example/x", "b.example/y"]
    );
}

#[tokio::test]
async fn a_repeated_identical_apply_is_a_no_op() {
    let server = server();
    let api: Api<Widget> = Api::default_namespaced(server.client());
    let pp = PatchParams::apply("alice");
    let first = api
        .patch(
            "ssa",
            &pp,
            &Patch::Apply(widget_apply(Some("img:1"), Some(2))),
        )
        .await
        .unwrap();
    let again = api
        .patch(
            "ssa",
            &pp,
            &Patch::Apply(widget_apply(Some("img:1"), Some(2))),
        )
        .await
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        first.metadata.resource_version
    );
    let status = json!({"apiVersion": "testkit.example.com/v1", "kind": "Widget", "metadata": {"name": "ssa"}, "status": {"phase": "Ready"}});
    let s1 = api
        .patch_status("ssa", &pp, &Patch::Apply(&status))
        .await
        .unwrap();
    let s2 = api
        .patch_status("ssa", &pp, &Patch::Apply(&status))
        .await
        .unwrap();
    assert_eq!(s1.metadata.resource_version, s2.metadata.resource_version);
}
