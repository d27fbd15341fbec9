//! Fault injection: injected status codes, latency and watch drops, limited to
//! chosen verbs and resources.

use std::time::Duration;

use kube::api::{ListParams, PostParams};
use protobot_testkit::{FaultRule, Verb};

use crate::support::{cms, config_map, server, status_of};

#[tokio::test]
async fn injected_errors_fire_on_their_verb_and_resource_a_bounded_number_of_times() {
    let server = server();
    let api = cms(&server);
    server.faults().inject(
        FaultRule::on(Verb::Create)
            .resource("configmaps")
            .status(500)
            .times(1),
    );
    server.faults().inject(
        FaultRule::on(Verb::Get)
            .resource("configmaps")
            .name("c")
            .status(409)
            .times(1),
    );
    let s = status_of(
        api.create(&PostParams::default(), &config_map("c", &[]))
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"));
    api.create(&PostParams::default(), &config_map("c", &[]))
        .await
        .unwrap();
    let s = status_of(api.get("c").await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    api.get("c").await.unwrap();
    api.list(&ListParams::default()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn latency_delays_only_the_chosen_verb() {
    let server = server();
    let api = cms(&server);
    server
        .faults()
        .inject(FaultRule::on(Verb::List).latency(Duration::from_secs(30)));
    let start = tokio::time::Instant::now();
    api.create(&PostParams::default(), &config_map("fast", &[]))
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(1));
    api.list(&ListParams::default()).await.unwrap();
    assert!(start.elapsed() >= Duration::from_secs(30));
}

#[tokio::test]
async fn watches_can_be_dropped_after_n_events() {
    use futures::StreamExt;
    use kube::api::WatchParams;
    let server = server();
    let api = cms(&server);
    for i in 0..3 {
        api.create(&PostParams::default(), &config_map(&format!("e{i}"), &[]))
            .await
            .unwrap();
    }
    server
        .faults()
        .inject(FaultRule::on(Verb::Watch).drop_watch_after(2).times(1));
    let stream = api.watch(&WatchParams::default(), "0").await.unwrap();
    let items: Vec<_> = crate::support::within("dropped watch", stream.collect::<Vec<_>>()).await;
    assert_eq!(items.iter().filter(|e| e.is_ok()).count(), 2);
    assert!(items.last().unwrap().is_err());
}

#[tokio::test]
async fn an_expired_watch_makes_the_runtime_watcher_relist() {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let server = server();
    let api = cms(&server);
    api.create(&PostParams::default(), &config_map("x1", &[]))
        .await
        .unwrap();
    // The first watch after the initial list expires after one event.
    server
        .faults()
        .inject(FaultRule::on(Verb::Watch).expire_watch_after(1).times(1));
    let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let mut synced = 0;
    crate::support::within("a relist after the expiry", async {
        while synced < 2 {
            match events.next().await {
                Some(Ok(Event::InitDone)) => {
                    synced += 1;
                    if synced == 1 {
                        api.create(&PostParams::default(), &config_map("x2", &[]))
                            .await
                            .unwrap();
                    }
                }
                Some(_) => {}
                None => panic!("watcher ended"),
            }
        }
    })
    .await;
    let relisted = server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::List)
        .count();
    assert_eq!(relisted, 2);
}
