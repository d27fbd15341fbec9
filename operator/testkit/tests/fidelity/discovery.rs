//! Discovery: `kube::Discovery` finds the built-in kinds and CRDs registered from
//! YAML, with their scope and subresources.

use kube::{
    Discovery,
    discovery::{ApiCapabilities, Scope},
};

use crate::support::server;

#[tokio::test]
async fn discovery_serves_core_kinds_and_registered_crds() {
    let server = server();
    let discovery = Discovery::new(server.client()).run().await.unwrap();
    let find = |group: &str, kind: &str| -> ApiCapabilities {
        let g = discovery
            .get(group)
            .unwrap_or_else(|| panic!("group {group:?} missing"));
        g.resources_by_stability()
            .into_iter()
            .find(|(ar, _)| ar.kind == kind)
            .map(|(_, caps)| caps)
            .unwrap_or_else(|| panic!("{kind} missing"))
    };
    for (group, kind) in [
        ("", "Pod"),
        ("", "Secret"),
        ("", "ConfigMap"),
        ("", "Event"),
        ("", "Namespace"),
        ("networking.k8s.io", "NetworkPolicy"),
        ("coordination.k8s.io", "Lease"),
        ("events.k8s.io", "Event"),
        ("testkit.example.com", "Widget"),
    ] {
        find(group, kind);
    }
    let widget = find("testkit.example.com", "Widget");
    assert_eq!(widget.scope, Scope::Namespaced);
    assert!(
        widget
            .subresources
            .iter()
            .any(|(ar, _)| ar.plural == "status")
    );
    assert_eq!(find("testkit.example.com", "Gadget").scope, Scope::Cluster);
    assert_eq!(find("", "Namespace").scope, Scope::Cluster);
}

#[tokio::test]
async fn crds_created_through_the_api_are_served() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::{Api, CustomResourceExt, api::PostParams};
    let server = protobot_testkit::ApiServer::new();
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    let created = crds
        .create(&PostParams::default(), &crate::support::Widget::crd())
        .await
        .unwrap();
    let established = created.status.unwrap().conditions.unwrap();
    assert!(
        established
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    let widgets: Api<crate::support::Widget> = Api::default_namespaced(server.client());
    widgets
        .create(
            &PostParams::default(),
            &crate::support::widget("via-api", "img"),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn aggregated_discovery_matches_legacy_discovery() {
    let server = server();
    let discovery = Discovery::new(server.client())
        .run_aggregated()
        .await
        .unwrap();
    let widget = discovery
        .get("testkit.example.com")
        .unwrap()
        .resources_by_stability()
        .into_iter()
        .find(|(ar, _)| ar.kind == "Widget")
        .unwrap();
    assert_eq!(widget.0.plural, "widgets");
    assert_eq!(widget.1.scope, Scope::Namespaced);
    assert!(
        widget
            .1
            .subresources
            .iter()
            .any(|(ar, _)| ar.plural == "status")
    );
    let core = discovery.get("").unwrap().resources_by_stability();
    assert!(
        core.iter()
            .any(|(ar, caps)| ar.kind == "Namespace" && caps.scope == Scope::Cluster)
    );
    assert!(core.iter().any(|(ar, _)| ar.kind == "Pod"));
}

#[tokio::test]
async fn crds_register_from_a_directory() {
    let server = protobot_testkit::ApiServer::new();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let names = server.register_crd_dir(dir).unwrap();
    assert_eq!(
        names,
        ["widgets.testkit.example.com", "gadgets.testkit.example.com"]
    );
    assert!(
        server
            .types()
            .lookup("testkit.example.com", "v1alpha1", "gadgets")
            .is_some()
    );
}

const TWO_VERSIONS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: things.testkit.example.com
spec:
  group: testkit.example.com
  scope: Namespaced
  names: {kind: Thing, plural: things}
  versions:
    - name: v1beta1
      served: true
      storage: false
      schema:
        openAPIV3Schema: {type: object, properties: {spec: {type: object, properties: {size: {type: string}}}}}
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, properties: {spec: {type: object, properties: {size: {type: integer}}}}}
"#;

#[tokio::test]
async fn multi_version_crds_serve_every_version_and_validate_per_version() {
    use kube::{
        Api,
        api::{DynamicObject, PostParams},
        core::{ApiResource, GroupVersionKind},
    };
    let server = protobot_testkit::ApiServer::new();
    server.register_crd_yaml(TWO_VERSIONS).unwrap();
    let api = |v: &str| {
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("testkit.example.com", v, "Thing"));
        Api::<DynamicObject>::namespaced_with(server.client(), "default", &ar)
    };
    let obj: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "testkit.example.com/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": {"size": 3}
    }))
    .unwrap();
    api("v1")
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
    let beta = api("v1beta1").get("t").await.unwrap();
    assert_eq!(
        beta.types.unwrap().api_version,
        "testkit.example.com/v1beta1"
    );
    let discovery = Discovery::new(server.client()).run().await.unwrap();
    let group = discovery.get("testkit.example.com").unwrap();
    assert_eq!(group.preferred_version_or_latest(), "v1");
}

#[tokio::test]
async fn deleting_a_crd_stops_serving_it_and_removes_its_objects() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::{
        Api,
        api::{DeleteParams, PostParams},
    };
    let server = server();
    let widgets: Api<crate::support::Widget> = Api::default_namespaced(server.client());
    widgets
        .create(
            &PostParams::default(),
            &crate::support::widget("doomed", "img"),
        )
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    crds.delete("widgets.testkit.example.com", &DeleteParams::default())
        .await
        .unwrap();
    let err = widgets.get("doomed").await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );
    assert!(
        server
            .object("testkit.example.com", "widgets", "default", "doomed")
            .is_none()
    );
}
