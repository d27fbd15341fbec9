//! Create, get, replace: system metadata, AlreadyExists, stale-update Conflict,
//! status subresource isolation and generation bumps.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::{Widget, WidgetStatus, cms, config_map, server, status_of, widget};

#[tokio::test]
async fn create_sets_uid_creation_timestamp_generation_and_increasing_resource_versions() {
    let server = server();
    let api = cms(&server);
    let a = api
        .create(&PostParams::default(), &config_map("a", &[("k", "v")]))
        .await
        .unwrap();
    let b = api
        .create(&PostParams::default(), &config_map("b", &[]))
        .await
        .unwrap();
    let rv = |c: &ConfigMap| {
        c.metadata
            .resource_version
            .clone()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(&b) > rv(&a));
    assert!(a.metadata.uid.is_some() && a.metadata.uid != b.metadata.uid);
    assert!(a.metadata.creation_timestamp.is_some());
    // ConfigMaps have no generation on a real server; custom resources start at 1.
    assert_eq!(a.metadata.generation, None);
    assert_eq!(a.metadata.namespace.as_deref(), Some("default"));
    let got = api.get("a").await.unwrap();
    assert_eq!(got.data, a.data);
}

#[tokio::test]
async fn creating_an_existing_name_is_409_already_exists_status() {
    let server = server();
    let api = cms(&server);
    api.create(&PostParams::default(), &config_map("dup", &[]))
        .await
        .unwrap();
    let s = status_of(
        api.create(&PostParams::default(), &config_map("dup", &[]))
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(s.message, "configmaps \"dup\" already exists");
    let details = s.details.unwrap();
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("dup", "configmaps")
    );
}

#[tokio::test]
async fn get_missing_is_404_not_found_and_missing_namespace_rejects_create() {
    let server = server();
    let s = status_of(cms(&server).get("nope").await);
    assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
    let other: Api<ConfigMap> = Api::namespaced(server.client(), "no-such-ns");
    let s = status_of(
        other
            .create(&PostParams::default(), &config_map("x", &[]))
            .await,
    );
    assert_eq!(s.code, 404);
    assert_eq!(s.message, "namespaces \"no-such-ns\" not found");
}

#[tokio::test]
async fn stale_update_gets_409_conflict() {
    let server = server();
    let api = cms(&server);
    let original = api
        .create(&PostParams::default(), &config_map("c", &[("n", "0")]))
        .await
        .unwrap();
    let mut first = original.clone();
    first.data = Some([("n".to_owned(), "1".to_owned())].into());
    api.replace("c", &PostParams::default(), &first)
        .await
        .unwrap();
    let mut stale = original;
    stale.data = Some([("n".to_owned(), "2".to_owned())].into());
    let s = status_of(api.replace("c", &PostParams::default(), &stale).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message.contains("the object has been modified"),
        "{}",
        s.message
    );
    assert_eq!(api.get("c").await.unwrap().data.unwrap()["n"], "1");
}

#[tokio::test]
async fn generation_bumps_on_spec_changes_only() {
    let server = server();
    let api: Api<Widget> = Api::default_namespaced(server.client());
    let w = api
        .create(&PostParams::default(), &widget("w", "img:1"))
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(1));
    let labelled = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(1));
    let status = api
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}})),
        )
        .await
        .unwrap();
    assert_eq!(status.metadata.generation, Some(1));
    let spec = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": "img:2"}})),
        )
        .await
        .unwrap();
    assert_eq!(spec.metadata.generation, Some(2));
}

#[tokio::test]
async fn status_subresource_isolates_main_and_status_writes() {
    let server = server();
    let api: Api<Widget> = Api::default_namespaced(server.client());
    let mut w = widget("iso", "img:1");
    w.status = Some(WidgetStatus {
        phase: Some("ignored-on-create".into()),
        observed_generation: None,
    });
    let created = api.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.status, None, "status is dropped on create");

    // A main-resource write ignores status changes.
    let mut main = created.clone();
    main.spec.image = "img:2".into();
    main.status = Some(WidgetStatus {
        phase: Some("sneaky".into()),
        observed_generation: None,
    });
    let after_main = api
        .replace("iso", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(after_main.spec.image, "img:2");
    assert_eq!(after_main.status, None);

    // A status write ignores everything but status.
    let mut st = after_main.clone();
    st.spec.image = "img:3".into();
    st.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    st.status = Some(WidgetStatus {
        phase: Some("Ready".into()),
        observed_generation: Some(2),
    });
    let after_status = api
        .replace_status("iso", &PostParams::default(), &st)
        .await
        .unwrap();
    assert_eq!(after_status.spec.image, "img:2");
    assert_eq!(after_status.metadata.labels, None);
    assert_eq!(after_status.status.unwrap().phase.as_deref(), Some("Ready"));
}

#[tokio::test]
async fn no_op_update_keeps_the_resource_version() {
    let server = server();
    let api = cms(&server);
    let c = api
        .create(&PostParams::default(), &config_map("same", &[("k", "v")]))
        .await
        .unwrap();
    let again = api
        .replace("same", &PostParams::default(), &c)
        .await
        .unwrap();
    assert_eq!(again.metadata.resource_version, c.metadata.resource_version);
}

#[tokio::test]
async fn invalid_names_are_422() {
    let server = server();
    let s = status_of(
        cms(&server)
            .create(&PostParams::default(), &config_map("Bad_Name", &[]))
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(s.details.unwrap().causes[0].field, "metadata.name");
}

#[tokio::test]
async fn generate_name_and_dry_run_behave_like_the_api_server() {
    let server = server();
    let api = cms(&server);
    let mut c = config_map("", &[]);
    c.metadata.name = None;
    c.metadata.generate_name = Some("gen-".into());
    let made = api.create(&PostParams::default(), &c).await.unwrap();
    let name = made.metadata.name.unwrap();
    assert!(
        name.starts_with("gen-") && name.len() == "gen-".len() + 5,
        "{name}"
    );

    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let rv_before = server.resource_version();
    let would = api.create(&dry, &config_map("dry", &[])).await.unwrap();
    assert_eq!(would.metadata.name.as_deref(), Some("dry"));
    assert_eq!(server.resource_version(), rv_before);
    assert!(api.get_opt("dry").await.unwrap().is_none());
}

#[tokio::test]
async fn the_request_log_shows_exactly_which_writes_were_made() {
    let server = server();
    let api = cms(&server);
    api.create(&PostParams::default(), &config_map("logged", &[]))
        .await
        .unwrap();
    server.clear_requests();
    api.get("logged").await.unwrap();
    let pp = PatchParams::apply("my-controller");
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "logged"}, "data": {"k": "v"}});
    api.patch("logged", &pp, &Patch::Apply(&body))
        .await
        .unwrap();
    let writes = server.writes();
    let summaries: Vec<String> = writes.iter().map(|w| w.summary()).collect();
    assert_eq!(summaries, ["Patch configmaps/logged"]);
    let w = &writes[0];
    assert!(w.is_apply());
    assert_eq!(w.field_manager.as_deref(), Some("my-controller"));
    assert_eq!(w.body.as_ref(), Some(&body));
    assert_eq!(w.code, 200);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn label_syntax_is_validated_and_secret_string_data_becomes_data() {
    use k8s_openapi::{ByteString, api::core::v1::Secret};
    let server = server();
    let mut c = config_map("labelled", &[]);
    c.metadata.labels = Some([("app".to_owned(), "x".repeat(64))].into());
    let s = status_of(cms(&server).create(&PostParams::default(), &c).await);
    assert_eq!(s.code, 422);
    assert_eq!(s.details.unwrap().causes[0].field, "metadata.labels");

    let secrets: Api<Secret> = Api::default_namespaced(server.client());
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        },
        string_data: Some([("token".to_owned(), "s3cr3t".to_owned())].into()),
        ..Secret::default()
    };
    let created = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    assert_eq!(created.string_data, None);
    assert_eq!(
        created.data.unwrap()["token"],
        ByteString(b"s3cr3t".to_vec())
    );
}

#[tokio::test]
async fn malformed_pods_are_rejected_with_422() {
    use k8s_openapi::api::core::v1::Pod;
    let server = server();
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "no-image"}, "spec": {"containers": [{"name": "main"}]}
    }))
    .unwrap();
    let s = status_of(pods.create(&PostParams::default(), &pod).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        s.message,
        "Pod \"no-image\" is invalid: spec.containers[0].image: Required value"
    );
}
