//! Structural-schema validation of custom resources: 422 Invalid naming the
//! field, unknown fields pruned, defaults applied.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::support::{Widget, server, status_of};

fn widgets(server: &protobot_testkit::ApiServer) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "testkit.example.com",
        "v1",
        "Widget",
    ));
    Api::namespaced_with(server.client(), "default", &ar)
}

fn dynamic(spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "testkit.example.com/v1", "kind": "Widget",
        "metadata": {"name": "w"}, "spec": spec
    }))
    .unwrap()
}

#[tokio::test]
async fn a_cr_violating_its_schema_is_rejected_with_422_naming_the_field() {
    let server = server();
    let api = widgets(&server);
    let s = status_of(
        api.create(
            &PostParams::default(),
            &dynamic(json!({"image": "i", "replicas": "two"})),
        )
        .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        s.message,
        "Widget.testkit.example.com \"w\" is invalid: spec.replicas: Invalid value: \"two\": spec.replicas in body must be of type integer: \"string\""
    );
    let details = s.details.unwrap();
    assert_eq!(
        (details.kind.as_str(), details.group.as_str()),
        ("Widget", "testkit.example.com")
    );
    assert_eq!(details.causes[0].field, "spec.replicas");

    let s = status_of(
        api.create(&PostParams::default(), &dynamic(json!({"replicas": 1})))
            .await,
    );
    assert_eq!(s.details.unwrap().causes[0].field, "spec.image");
    assert!(
        s.message.contains("spec.image: Required value"),
        "{}",
        s.message
    );

    let s = status_of(
        api.create(
            &PostParams::default(),
            &dynamic(json!({"image": "i", "mode": "medium"})),
        )
        .await,
    );
    assert!(
        s.message.contains(
            "spec.mode: Unsupported value: \"medium\": supported values: \"fast\", \"slow\""
        ),
        "{}",
        s.message
    );

    let s = status_of(
        api.create(
            &PostParams::default(),
            &dynamic(json!({"image": "i", "replicas": -1})),
        )
        .await,
    );
    assert_eq!(s.details.unwrap().causes[0].field, "spec.replicas");
}

#[tokio::test]
async fn unknown_fields_are_pruned_and_defaults_applied() {
    let server = server();
    let api = widgets(&server);
    let created = api
        .create(
            &PostParams::default(),
            &dynamic(json!({"image": "i", "bogus": true, "extra": {"anything": {"goes": 1}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"],
        json!({"image": "i", "replicas": 1, "extra": {"anything": {"goes": 1}}})
    );
    let typed: Api<Widget> = Api::default_namespaced(server.client());
    assert_eq!(typed.get("w").await.unwrap().spec.replicas, Some(1));
}

#[tokio::test]
async fn updates_are_validated_too() {
    let server = server();
    let api = widgets(&server);
    let mut w = api
        .create(&PostParams::default(), &dynamic(json!({"image": "i"})))
        .await
        .unwrap();
    w.data["spec"]["replicas"] = json!("many");
    assert_eq!(
        status_of(api.replace("w", &PostParams::default(), &w).await).code,
        422
    );
}

#[tokio::test]
async fn strict_field_validation_rejects_unknown_fields_instead_of_pruning() {
    use kube::api::{Patch, PatchParams};
    let server = server();
    let api = widgets(&server);
    api.create(&PostParams::default(), &dynamic(json!({"image": "i"})))
        .await
        .unwrap();
    let strict_merge = PatchParams::default().validation_strict();
    let s = status_of(
        api.patch(
            "w",
            &strict_merge,
            &Patch::Merge(json!({"spec": {"bogus": 1}})),
        )
        .await,
    );
    assert_eq!(s.code, 400);
    assert_eq!(
        s.message,
        "strict decoding error: unknown field \"spec.bogus\""
    );
    let apply = PatchParams::apply("m").validation_strict();
    let body = json!({"apiVersion": "testkit.example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"image": "i", "nope": true}});
    assert_eq!(
        status_of(api.patch("w", &apply, &Patch::Apply(body)).await).code,
        400
    );
}
