//! kube-runtime against the double, unchanged: `watcher` through a dropped
//! connection, and a trivial `Controller` that reconciles ConfigMaps.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    runtime::{
        Controller,
        controller::Action,
        watcher::{self, Event},
    },
};
use serde_json::json;

use crate::support::{await_condition, cms, config_map, server, within};

#[tokio::test]
async fn watcher_recovers_from_a_dropped_connection_without_losing_objects() {
    let server = server();
    let api = cms(&server);
    let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    api.create(&PostParams::default(), &config_map("w-1", &[]))
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    within("w-1", async {
        while !seen.contains("w-1") {
            if let Some(Ok(Event::Apply(c) | Event::InitApply(c))) = events.next().await {
                seen.insert(c.metadata.name.unwrap());
            }
        }
    })
    .await;
    server.faults().drop_watches();
    api.create(&PostParams::default(), &config_map("w-2", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("w-3", &[]))
        .await
        .unwrap();
    within("w-2 and w-3 after the drop", async {
        while !(seen.contains("w-2") && seen.contains("w-3")) {
            match events.next().await {
                Some(Ok(Event::Apply(c) | Event::InitApply(c))) => {
                    seen.insert(c.metadata.name.unwrap());
                }
                Some(_) => {}
                None => panic!("watcher ended"),
            }
        }
    })
    .await;
}

#[derive(Debug, thiserror::Error)]
#[error("failed to patch configmap {name}")]
struct ReconcileError {
    name: String,
    #[source]
    source: kube::Error,
}

async fn reconcile(cm: Arc<ConfigMap>, api: Arc<Api<ConfigMap>>) -> Result<Action, ReconcileError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
        "data": {"reconciled": "true"}
    });
    api.patch(
        &name,
        &PatchParams::apply("testkit-controller"),
        &Patch::Apply(patch),
    )
    .await
    .map_err(|source| ReconcileError {
        name: name.clone(),
        source,
    })?;
    Ok(Action::await_change())
}

fn error_policy(_: Arc<ConfigMap>, _: &ReconcileError, _: Arc<Api<ConfigMap>>) -> Action {
    Action::requeue(Duration::from_millis(50))
}

#[tokio::test]
async fn a_trivial_controller_reconciles_against_the_double() {
    let server = server();
    let api = cms(&server);
    // The first reconcile patch fails once: the controller must retry.
    server.faults().inject(
        protobot_testkit::FaultRule::on(protobot_testkit::Verb::Patch)
            .resource("configmaps")
            .status(500)
            .times(1),
    );
    let ctx = Arc::new(api.clone());
    let controller = Controller::new(api.clone(), watcher::Config::default())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);
    api.create(&PostParams::default(), &config_map("ctl-1", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("ctl-2", &[]))
        .await
        .unwrap();
    for name in ["ctl-1", "ctl-2"] {
        await_condition(
            name,
            || api.get(name),
            |r| {
                r.as_ref().is_ok_and(|c| {
                    c.data
                        .as_ref()
                        .is_some_and(|d| d.get("reconciled").is_some())
                })
            },
        )
        .await
        .unwrap();
    }
    handle.abort();
}

mod with_finalizer {
    //! kube-runtime's `finalizer()` helper (JSON patches with `test` ops) on a CR.

    use std::sync::{Arc, Mutex};

    use futures::StreamExt;
    use kube::{
        Api, ResourceExt,
        api::{DeleteParams, PostParams},
        runtime::{
            Controller,
            controller::Action,
            finalizer::{Event as FinalizerEvent, finalizer},
            watcher,
        },
    };

    use crate::support::{Widget, await_condition, server, widget};

    const FINALIZER: &str = "testkit.example.com/cleanup";

    struct Ctx {
        api: Api<Widget>,
        cleaned: Mutex<Vec<String>>,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("failed to run the finalizer for a widget")]
    struct Error(#[source] Box<kube::runtime::finalizer::Error<std::convert::Infallible>>);

    async fn reconcile(w: Arc<Widget>, ctx: Arc<Ctx>) -> Result<Action, Error> {
        let c = ctx.clone();
        finalizer(&ctx.api, FINALIZER, w, |event| async move {
            if let FinalizerEvent::Cleanup(w) = event {
                c.cleaned.lock().unwrap().push(w.name_any());
            }
            Ok::<_, std::convert::Infallible>(Action::await_change())
        })
        .await
        .map_err(|e| Error(Box::new(e)))
    }

    fn error_policy(_: Arc<Widget>, _: &Error, _: Arc<Ctx>) -> Action {
        Action::requeue(std::time::Duration::from_millis(50))
    }

    #[tokio::test]
    async fn finalizer_helper_adds_then_cleans_up_and_releases_the_object() {
        let server = server();
        let api: Api<Widget> = Api::default_namespaced(server.client());
        let ctx = Arc::new(Ctx {
            api: api.clone(),
            cleaned: Mutex::new(Vec::new()),
        });
        let run = Controller::new(api.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|_| async {});
        let handle = tokio::spawn(run);
        api.create(&PostParams::default(), &widget("fin", "img"))
            .await
            .unwrap();
        await_condition(
            "finalizer added",
            || api.get("fin"),
            |r| {
                r.as_ref()
                    .is_ok_and(|w| w.finalizers().iter().any(|f| f == FINALIZER))
            },
        )
        .await
        .unwrap();
        api.delete("fin", &DeleteParams::default()).await.unwrap();
        await_condition(
            "widget gone",
            || api.get_opt("fin"),
            |r| matches!(r, Ok(None)),
        )
        .await
        .unwrap();
        assert_eq!(*ctx.cleaned.lock().unwrap(), ["fin"]);
        handle.abort();
    }
}

#[tokio::test]
async fn the_event_recorder_creates_then_updates_a_series() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::{
        Resource,
        runtime::events::{Event as RecorderEvent, EventType, Recorder},
    };
    let server = server();
    let api = cms(&server);
    let cm = api
        .create(&PostParams::default(), &config_map("evented", &[]))
        .await
        .unwrap();
    let recorder = Recorder::new(server.client(), "testkit-controller".into());
    let ev = RecorderEvent {
        type_: EventType::Warning,
        reason: "ApplyFailed".into(),
        note: Some("failed to apply".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    let reference = cm.object_ref(&());
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();
    let events: Api<K8sEvent> = Api::default_namespaced(server.client());
    let list = events.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1, "a repeated event updates its series");
    let e = &list.items[0];
    assert_eq!(e.reason.as_deref(), Some("ApplyFailed"));
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("evented")
    );
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
}

#[tokio::test]
async fn watcher_with_streaming_lists_syncs_and_follows_changes() {
    let server = server();
    let api = cms(&server);
    api.create(&PostParams::default(), &config_map("before", &[]))
        .await
        .unwrap();
    let mut events =
        watcher::watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut init_done = false;
    let mut seen = BTreeSet::new();
    within("initial sync and a later change", async {
        loop {
            match events.next().await {
                Some(Ok(Event::InitApply(c))) => {
                    seen.insert(c.metadata.name.unwrap());
                }
                Some(Ok(Event::InitDone)) => {
                    init_done = true;
                    api.create(&PostParams::default(), &config_map("after", &[]))
                        .await
                        .unwrap();
                }
                Some(Ok(Event::Apply(c))) => {
                    seen.insert(c.metadata.name.unwrap());
                    if seen.contains("after") {
                        break;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("watcher error: {e}"),
                None => panic!("watcher ended"),
            }
        }
    })
    .await;
    assert!(init_done);
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["after", "before"]);
}

mod owns {
    //! `Controller::owns`: a change to an owned object re-reconciles its owner.

    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{
        Api, Resource, ResourceExt,
        api::{Patch, PatchParams, PostParams},
        runtime::{Controller, controller::Action, watcher},
    };
    use serde_json::json;

    use crate::support::{Widget, await_condition, server, widget};

    struct Ctx {
        cms: Api<ConfigMap>,
        reconciles: Mutex<usize>,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("failed to apply the child configmap")]
    struct Error(#[source] kube::Error);

    async fn reconcile(w: Arc<Widget>, ctx: Arc<Ctx>) -> Result<Action, Error> {
        *ctx.reconciles.lock().unwrap() += 1;
        let oref = w.controller_owner_ref(&()).unwrap();
        let child = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("{}-child", w.name_any()), "ownerReferences": [oref]},
            "data": {"image": w.spec.image}
        });
        ctx.cms
            .patch(
                &format!("{}-child", w.name_any()),
                &PatchParams::apply("widget-ctl").force(),
                &Patch::Apply(child),
            )
            .await
            .map_err(Error)?;
        Ok(Action::await_change())
    }

    fn error_policy(_: Arc<Widget>, _: &Error, _: Arc<Ctx>) -> Action {
        Action::requeue(Duration::from_millis(50))
    }

    #[tokio::test]
    async fn editing_an_owned_child_reconciles_the_owner_which_restores_it() {
        let server = server();
        let widgets: Api<Widget> = Api::default_namespaced(server.client());
        let cms: Api<ConfigMap> = Api::default_namespaced(server.client());
        let ctx = Arc::new(Ctx {
            cms: cms.clone(),
            reconciles: Mutex::new(0),
        });
        let run = Controller::new(widgets.clone(), watcher::Config::default())
            .owns(cms.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|_| async {});
        let handle = tokio::spawn(run);
        widgets
            .create(&PostParams::default(), &widget("parent", "img:1"))
            .await
            .unwrap();
        await_condition(
            "child created",
            || cms.get_opt("parent-child"),
            |r| matches!(r, Ok(Some(_))),
        )
        .await
        .unwrap();
        // Someone edits the child by hand; the owner's controller puts it back.
        cms.patch(
            "parent-child",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"image": "tampered"}})),
        )
        .await
        .unwrap();
        await_condition(
            "child restored",
            || cms.get("parent-child"),
            |r| {
                r.as_ref()
                    .is_ok_and(|c| c.data.as_ref().is_some_and(|d| d["image"] == "img:1"))
            },
        )
        .await
        .unwrap();
        assert!(*ctx.reconciles.lock().unwrap() >= 2);
        handle.abort();
    }
}
