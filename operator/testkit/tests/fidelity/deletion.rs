//! Deletion: finalizers hold objects (with `deletionTimestamp`) until emptied,
//! owner-reference garbage collection (background, foreground, orphan), and
//! namespace termination.

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::OwnerReference};
use kube::{
    Resource,
    api::{Api, DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::support::{Widget, await_condition, cms, config_map, server, status_of, widget};

fn owned_by(name: &str, owner: &Widget, block: bool) -> ConfigMap {
    let mut c = config_map(name, &[]);
    let mut oref: OwnerReference = owner.controller_owner_ref(&()).unwrap();
    oref.block_owner_deletion = Some(block);
    c.metadata.owner_references = Some(vec![oref]);
    c
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let server = server();
    let api = cms(&server);
    let mut c = config_map("held", &[]);
    c.metadata.finalizers = Some(vec!["testkit.example.com/cleanup".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();

    let deleted = api.delete("held", &DeleteParams::default()).await.unwrap();
    let pending = deleted
        .left()
        .expect("object still exists while finalizers remain");
    assert!(pending.metadata.deletion_timestamp.is_some());
    let still = api.get("held").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());

    // New finalizers cannot be added during deletion.
    let s = status_of(
        api.patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["testkit.example.com/cleanup", "late"]}}),
            ),
        )
        .await,
    );
    assert_eq!(s.code, 422);

    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(status_of(api.get("held").await).code, 404);
}

#[tokio::test]
async fn delete_without_finalizers_returns_success_status() {
    let server = server();
    let api = cms(&server);
    api.create(&PostParams::default(), &config_map("gone", &[]))
        .await
        .unwrap();
    let status = api
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap()
        .right()
        .unwrap();
    assert!(status.is_success());
    assert_eq!(
        status_of(api.delete("gone", &DeleteParams::default()).await).code,
        404
    );
}

#[tokio::test]
async fn owner_gc_deletes_dependents_in_background() {
    let server = server();
    let widgets: Api<Widget> = Api::default_namespaced(server.client());
    let api = cms(&server);
    let owner = widgets
        .create(&PostParams::default(), &widget("owner", "img"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_by("dep-1", &owner, false))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_by("dep-2", &owner, false))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("unrelated", &[]))
        .await
        .unwrap();

    widgets
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    await_condition(
        "dependents gone",
        || api.get_opt("dep-1"),
        |r| matches!(r, Ok(None)),
    )
    .await
    .unwrap();
    assert!(api.get_opt("dep-2").await.unwrap().is_none());
    assert!(api.get_opt("unrelated").await.unwrap().is_some());
}

#[tokio::test]
async fn foreground_deletion_waits_for_blocking_dependents() {
    let server = server();
    let widgets: Api<Widget> = Api::default_namespaced(server.client());
    let api = cms(&server);
    let owner = widgets
        .create(&PostParams::default(), &widget("fg", "img"))
        .await
        .unwrap();
    let mut dep = owned_by("blocker", &owner, true);
    dep.metadata.finalizers = Some(vec!["testkit.example.com/slow".into()]);
    api.create(&PostParams::default(), &dep).await.unwrap();

    widgets
        .delete("fg", &DeleteParams::foreground())
        .await
        .unwrap();
    let waiting = widgets.get("fg").await.unwrap();
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert!(
        waiting
            .metadata
            .finalizers
            .unwrap()
            .contains(&"foregroundDeletion".to_owned())
    );
    assert!(
        api.get("blocker")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    api.patch(
        "blocker",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    await_condition(
        "owner gone",
        || widgets.get_opt("fg"),
        |r| matches!(r, Ok(None)),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn orphan_deletion_keeps_dependents_without_the_owner_reference() {
    let server = server();
    let widgets: Api<Widget> = Api::default_namespaced(server.client());
    let api = cms(&server);
    let owner = widgets
        .create(&PostParams::default(), &widget("orph", "img"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_by("kept", &owner, false))
        .await
        .unwrap();
    widgets
        .delete("orph", &DeleteParams::orphan())
        .await
        .unwrap();
    await_condition(
        "owner gone",
        || widgets.get_opt("orph"),
        |r| matches!(r, Ok(None)),
    )
    .await
    .unwrap();
    let kept = api.get("kept").await.unwrap();
    assert_eq!(kept.metadata.owner_references, None);
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_contents() {
    let server = server();
    server.create_namespace("doomed").unwrap();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "doomed");
    api.create(&PostParams::default(), &config_map("inside", &[]))
        .await
        .unwrap();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(server.client());
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    await_condition(
        "namespace gone",
        || namespaces.get_opt("doomed"),
        |r| matches!(r, Ok(None)),
    )
    .await
    .unwrap();
    assert!(
        server
            .object("", "configmaps", "doomed", "inside")
            .is_none()
    );
}

#[tokio::test]
async fn wait_until_sees_deletion_through_a_watch() {
    use std::time::Duration;

    use kube::runtime::wait::conditions::is_deleted;
    let server = server();
    let api = cms(&server);
    let c = api
        .create(&PostParams::default(), &config_map("bye", &[]))
        .await
        .unwrap();
    let uid = c.metadata.uid.unwrap();
    let waiter = {
        let api = api.clone();
        tokio::spawn(async move {
            protobot_testkit::until(&api, "bye", Duration::from_secs(10), is_deleted(&uid)).await
        })
    };
    api.delete("bye", &DeleteParams::default()).await.unwrap();
    waiter.await.unwrap().unwrap();
    let err = protobot_testkit::until(
        &api,
        "never",
        Duration::from_millis(100),
        |o: Option<&ConfigMap>| o.is_some(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, protobot_testkit::WaitError::Timeout { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn owner_gc_finds_dependents_written_long_before_the_owner_goes() {
    // The collector tracks dependents by owner uid instead of rescanning every
    // object on every write: a dependent last written many writes ago must
    // still be collected when its owner goes.
    let server = server();
    let widgets: Api<Widget> = Api::default_namespaced(server.client());
    let api = cms(&server);
    let owner = widgets
        .create(&PostParams::default(), &widget("owner", "img"))
        .await
        .unwrap();
    let mut dep = api
        .create(&PostParams::default(), &owned_by("dep", &owner, false))
        .await
        .unwrap();
    dep.data = Some([("k".to_string(), "v".to_string())].into());
    api.replace("dep", &PostParams::default(), &dep)
        .await
        .unwrap();
    for n in 0..5 {
        let name = format!("filler-{n}");
        api.create(&PostParams::default(), &config_map(&name, &[]))
            .await
            .unwrap();
        api.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    widgets
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    await_condition(
        "dependent gone",
        || api.get_opt("dep"),
        |r| matches!(r, Ok(None)),
    )
    .await
    .unwrap();
    assert!(widgets.get_opt("owner").await.unwrap().is_none());
}
