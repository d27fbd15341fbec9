//! Pod networking on the simulated node: what a NetworkPolicy-enforcing CNI
//! and kube-proxy would give a sandbox pod, no more.
//!
//! A pod has no network at all (bubblewrap's own empty network namespace)
//! unless a NetworkPolicy that selects it allows egress to a Service the
//! node can reach. Then the pod gets a network namespace of its own holding
//! only `lo` (`protobot_egress::netns`, root required), and for each allowed
//! Service a listener inside it on the Service's cluster IP and port (on
//! `lo`), relayed from the host's namespace to the Service's endpoint. There
//! is no resolver, as under the run's policy (which denies DNS): the pod
//! reaches the Service by its cluster IP only, and every name fails at once;
//! there is no route, so every direct connection fails at once.
//!
//! What is simulated: the Service's endpoint is read from its annotation
//! [`NODE_ENDPOINT_ANNOTATION`] (`host:port` on the test machine's
//! loopback), because the proxy runs as a process the test started, not as a
//! pod whose IP an EndpointSlice could carry (the API server refuses loopback
//! endpoint addresses). Everything else comes from the objects a real
//! cluster enforces: the pod's labels, the NetworkPolicies of its namespace
//! (`podSelector`, `policyTypes`, egress `to` with `namespaceSelector` and
//! `podSelector` as `matchLabels`, TCP `ports`), the Namespaces' labels, and
//! the Services' `selector`, `clusterIP` and ports. Selectors with
//! `matchExpressions`, `ipBlock` peers and named ports allow nothing here
//! (the simulated node never grants more than it can read). A pod that no
//! policy selects still gets no network, unlike a real cluster's default
//! allow: sandbox pods always have a policy, and nothing else here needs one.
//!
//! [`allowed_destinations`] is pure; [`PodNetwork::set_up`] is the edge.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
};

use k8s_openapi::api::{
    core::v1::{Namespace, Service},
    networking::v1::NetworkPolicy,
};
use kube::{Api, api::ListParams};
use protobot_egress::netns::{NetNs, Relay, bind_inside};
use serde_json::Value;

use super::backend::Backend;

/// Annotation on a Service naming the `host:port` its traffic reaches on the
/// node (the simulated kube-proxy's endpoint).
pub const NODE_ENDPOINT_ANNOTATION: &str = "testkit.protobot.dev/node-endpoint";

/// A Service a pod may reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// Where the pod connects: the Service's cluster IP (loopback when it
    /// has none) and port.
    pub address: IpAddr,
    /// The Service's port.
    pub port: u16,
    /// The endpoint on the node the connection is relayed to.
    pub endpoint_host: String,
    /// Its port.
    pub endpoint_port: u16,
}

fn labels(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// A label selector's `matchLabels`, or `None` when it has `matchExpressions`
/// (which the simulated node does not evaluate, so it matches nothing).
fn match_labels(selector: &Value) -> Option<BTreeMap<String, String>> {
    let has_expressions = selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    (!has_expressions).then(|| string_map(selector.get("matchLabels")))
}

fn subset(wanted: &BTreeMap<String, String>, have: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| have.get(k) == Some(v))
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

/// A Namespace's labels, with the `kubernetes.io/metadata.name` label every
/// API server sets (also when the store holds no Namespace object).
fn namespace_labels(namespaces: &[Value], name: &str) -> BTreeMap<String, String> {
    let mut l = namespaces
        .iter()
        .find(|n| str_at(n, "/metadata/name") == Some(name))
        .map(labels)
        .unwrap_or_default();
    l.insert("kubernetes.io/metadata.name".into(), name.to_owned());
    l
}

fn parse_endpoint(v: &str) -> Option<(String, u16)> {
    let (host, port) = v.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

/// Whether `policy` selects `pod` and restricts its egress (so its egress rules apply).
fn limits_egress_of(pod: &Value, policy: &Value) -> bool {
    let pod_ns = str_at(pod, "/metadata/namespace").unwrap_or("default");
    if str_at(policy, "/metadata/namespace").is_some_and(|ns| ns != pod_ns) {
        return false;
    }
    let selects = policy
        .pointer("/spec/podSelector")
        .and_then(match_labels)
        .is_some_and(|wanted| subset(&wanted, &labels(pod)));
    let types: Vec<&str> = policy
        .pointer("/spec/policyTypes")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    selects && (types.contains(&"Egress") || policy.pointer("/spec/egress").is_some())
}

/// Whether any of `policies` may let `pod` reach a Service (one that selects it has an
/// egress rule naming peers): without one, the pod gets no network and nothing else is read.
fn may_reach_services(pod: &Value, policies: &[Value]) -> bool {
    policies
        .iter()
        .filter(|p| limits_egress_of(pod, p))
        .filter_map(|p| p.pointer("/spec/egress").and_then(Value::as_array))
        .flatten()
        .any(|rule| {
            rule.get("to")
                .and_then(Value::as_array)
                .is_some_and(|to| !to.is_empty())
        })
}

/// The Services `pod` may reach under `policies` (its namespace's
/// NetworkPolicies), given every Namespace and Service the node can see.
/// Pure; see the module docs for what is read.
pub fn allowed_destinations(
    pod: &Value,
    policies: &[Value],
    namespaces: &[Value],
    services: &[Value],
) -> Vec<Destination> {
    let pod_ns = str_at(pod, "/metadata/namespace").unwrap_or("default");
    let mut out: Vec<Destination> = Vec::new();
    for policy in policies.iter().filter(|p| limits_egress_of(pod, p)) {
        for rule in policy
            .pointer("/spec/egress")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let ports: Option<Vec<u16>> = rule.get("ports").and_then(Value::as_array).map(|a| {
                a.iter()
                    .filter(|p| p.get("protocol").and_then(Value::as_str).unwrap_or("TCP") == "TCP")
                    .filter_map(|p| p.get("port").and_then(Value::as_u64))
                    .filter_map(|p| u16::try_from(p).ok())
                    .collect()
            });
            for peer in rule
                .get("to")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if peer.get("ipBlock").is_some() {
                    continue;
                }
                let ns_selector = match peer.get("namespaceSelector") {
                    Some(s) => match match_labels(s) {
                        Some(m) => Some(m),
                        None => continue,
                    },
                    None => None,
                };
                let pod_selector = match peer.get("podSelector") {
                    Some(s) => match match_labels(s) {
                        Some(m) => m,
                        None => continue,
                    },
                    None => BTreeMap::new(),
                };
                for svc in services {
                    let Some(svc_ns) = str_at(svc, "/metadata/namespace") else {
                        continue;
                    };
                    let ns_ok = match &ns_selector {
                        Some(m) => subset(m, &namespace_labels(namespaces, svc_ns)),
                        None => svc_ns == pod_ns,
                    };
                    // The Service's selector is the label set of the pods behind it.
                    let backing = string_map(svc.pointer("/spec/selector"));
                    if !ns_ok || backing.is_empty() || !subset(&pod_selector, &backing) {
                        continue;
                    }
                    let Some(endpoint) = svc
                        .pointer("/metadata/annotations")
                        .and_then(|a| a.get(NODE_ENDPOINT_ANNOTATION))
                        .and_then(Value::as_str)
                        .and_then(parse_endpoint)
                    else {
                        continue;
                    };
                    let address = str_at(svc, "/spec/clusterIP")
                        .and_then(|ip| ip.parse::<IpAddr>().ok())
                        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
                    for sp in svc
                        .pointer("/spec/ports")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if sp.get("protocol").and_then(Value::as_str).unwrap_or("TCP") != "TCP" {
                            continue;
                        }
                        let Some(port) = sp
                            .get("port")
                            .and_then(Value::as_u64)
                            .and_then(|p| u16::try_from(p).ok())
                        else {
                            continue;
                        };
                        // NetworkPolicy ports are the pods' ports: the Service's targetPort.
                        let target = match sp.get("targetPort") {
                            None => Some(port),
                            Some(t) => t.as_u64().and_then(|p| u16::try_from(p).ok()),
                        };
                        let port_ok = match (&ports, target) {
                            (None, _) => true,
                            (Some(list), Some(t)) => list.is_empty() || list.contains(&t),
                            (Some(_), None) => false,
                        };
                        if !port_ok {
                            continue;
                        }
                        let d = Destination {
                            namespace: svc_ns.to_owned(),
                            service: str_at(svc, "/metadata/name").unwrap_or("").to_owned(),
                            address,
                            port,
                            endpoint_host: endpoint.0.clone(),
                            endpoint_port: endpoint.1,
                        };
                        if !out.contains(&d) {
                            out.push(d);
                        }
                    }
                }
            }
        }
    }
    out
}

/// The Services `pod` may reach, read through `backend` (its namespace's
/// NetworkPolicies, every Namespace and Service). A read that fails allows
/// nothing more (logged).
pub(crate) async fn destinations(backend: &Backend, pod: &Value) -> Vec<Destination> {
    let ns = str_at(pod, "/metadata/namespace").unwrap_or("default");
    let (policies, namespaces, services) = match backend {
        Backend::Double(shared) => {
            let state = shared.lock();
            let of = |group: &str, plural: &str| -> Vec<Value> {
                state
                    .objects()
                    .filter(|(k, _)| k.group == group && k.plural == plural)
                    .map(|(_, v)| v.clone())
                    .collect()
            };
            (
                of("networking.k8s.io", "networkpolicies"),
                of("", "namespaces"),
                of("", "services"),
            )
        }
        Backend::Api(node) => {
            // Boxed: the API calls' futures are large (see backend.rs).
            Box::pin(async move {
                let client = node.client().clone();
                let list = |r: Result<Vec<Value>, kube::Error>, what: &str| {
                    r.unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "simulated kubelet: listing {what} for pod networking; the pod gets none of them");
                        Vec::new()
                    })
                };
                async fn values<K>(api: Api<K>) -> Result<Vec<Value>, kube::Error>
                where
                    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
                {
                    Ok(api
                        .list(&ListParams::default())
                        .await?
                        .items
                        .iter()
                        .filter_map(|o| serde_json::to_value(o).ok())
                        .collect())
                }
                let policies = list(
                    values(Api::<NetworkPolicy>::namespaced(client.clone(), ns)).await,
                    "NetworkPolicies",
                );
                if !may_reach_services(pod, &policies) {
                    return (policies, Vec::new(), Vec::new());
                }
                (
                    policies,
                    list(values(Api::<Namespace>::all(client.clone())).await, "Namespaces"),
                    list(values(Api::<Service>::all(client)).await, "Services"),
                )
            })
            .await
        }
    };
    allowed_destinations(pod, &policies, &namespaces, &services)
}

/// What a container of a pod with egress runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerNetwork {
    /// The pod's network namespace file (`nsenter --net=`).
    pub netns: PathBuf,
}

/// A pod's network namespace and relays; dropping it ends them.
pub(crate) struct PodNetwork {
    // Relays first: they stop accepting before the namespace goes.
    _relays: Vec<Relay>,
    netns: NetNs,
}

impl PodNetwork {
    /// Builds the namespace for `destinations` (none: `Ok(None)`, the pod
    /// gets no network). Must be called inside a Tokio runtime; blocks on `ip`.
    pub fn set_up(name: &str, destinations: &[Destination]) -> Result<Option<PodNetwork>, String> {
        if destinations.is_empty() {
            return Ok(None);
        }
        let ip = find_on_path("ip").ok_or_else(|| {
            "the pod may reach an egress Service, but `ip` (iproute2) is not installed; the simulated node builds its network namespace with it".to_owned()
        })?;
        let netns = NetNs::create(&ip, name).map_err(|e| {
            format!("{e} (the simulated node gives pods egress only when it runs as root)")
        })?;
        let mut relays = Vec::new();
        let mut bound: Vec<(IpAddr, u16)> = Vec::new();
        for d in destinations {
            if bound.contains(&(d.address, d.port)) {
                continue;
            }
            bound.push((d.address, d.port));
            netns
                .add_local_address(d.address)
                .map_err(|e| e.to_string())?;
            let listener = bind_inside(&netns.path(), d.address, d.port).map_err(|e| {
                format!(
                    "failed to bind {}:{} inside the pod's network namespace: {e}",
                    d.address, d.port
                )
            })?;
            relays.push(
                Relay::start(listener, d.endpoint_host.clone(), d.endpoint_port)
                    .map_err(|e| format!("failed to start the relay to {}: {e}", d.service))?,
            );
        }
        Ok(Some(PodNetwork {
            _relays: relays,
            netns,
        }))
    }

    /// What the pod's containers run in.
    pub fn container(&self) -> ContainerNetwork {
        ContainerNetwork {
            netns: self.netns.path(),
        }
    }
}

/// Sets up `pod`'s network as its namespace's policies allow (`Ok(None)`: no
/// network at all); the namespace is named after the pod's `uid`.
pub(crate) async fn prepare(
    backend: &Backend,
    pod: &Value,
    uid: &str,
) -> Result<Option<PodNetwork>, String> {
    let destinations = destinations(backend, pod).await;
    if destinations.is_empty() {
        return Ok(None);
    }
    let name = format!("testkit-{}", uid.get(..23).unwrap_or(uid));
    tokio::task::spawn_blocking(move || PodNetwork::set_up(&name, &destinations))
        .await
        .map_err(|e| format!("setting up the pod's network panicked: {e}"))?
}

/// `tool` on `PATH` (or in `/usr/sbin`, `/sbin`, where `ip` lives).
pub(crate) fn find_on_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Value {
        json!({"metadata": {"namespace": "sb", "name": "p", "labels": {"protobot.dev/run": "r1"}}})
    }

    fn policy(egress: Value) -> Value {
        json!({"metadata": {"namespace": "sb", "name": "np"}, "spec": {
            "podSelector": {"matchLabels": {"protobot.dev/run": "r1"}},
            "policyTypes": ["Ingress", "Egress"],
            "egress": egress,
        }})
    }

    fn proxy_rule() -> Value {
        json!([{
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "sys"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "protobot-egress-proxy"}}}],
            "ports": [{"protocol": "TCP", "port": 3128}],
        }])
    }

    fn service(ns: &str, selector: Value, target: u64) -> Value {
        json!({"metadata": {"namespace": ns, "name": "protobot-egress-proxy",
                "annotations": {NODE_ENDPOINT_ANNOTATION: "127.0.0.1:40123"}},
               "spec": {"selector": selector, "clusterIP": "10.96.0.17",
                        "ports": [{"port": 3128, "targetPort": target, "protocol": "TCP"}]}})
    }

    fn proxy_labels() -> Value {
        json!({"app.kubernetes.io/name": "protobot-egress-proxy", "app.kubernetes.io/instance": "x"})
    }

    #[test]
    fn the_policy_allows_exactly_the_proxy_service() {
        let got = allowed_destinations(
            &pod(),
            &[policy(proxy_rule())],
            &[],
            &[service("sys", proxy_labels(), 3128)],
        );
        assert_eq!(
            got,
            vec![Destination {
                namespace: "sys".into(),
                service: "protobot-egress-proxy".into(),
                address: "10.96.0.17".parse().unwrap(),
                port: 3128,
                endpoint_host: "127.0.0.1".into(),
                endpoint_port: 40123,
            }]
        );
    }

    #[test]
    fn anything_the_policy_does_not_name_is_unreachable() {
        let none = |policies: &[Value], services: &[Value]| {
            allowed_destinations(&pod(), policies, &[], services).is_empty()
        };
        let svc = service("sys", proxy_labels(), 3128);
        // The deny-all policy of a run without egress.
        assert!(none(&[policy(json!([]))], std::slice::from_ref(&svc)));
        // No policy selects the pod.
        let mut other = policy(proxy_rule());
        other["spec"]["podSelector"] = json!({"matchLabels": {"protobot.dev/run": "r2"}});
        assert!(none(&[other], std::slice::from_ref(&svc)));
        // The Service is in another namespace, selects other pods, or has another port.
        assert!(none(
            &[policy(proxy_rule())],
            &[service("elsewhere", proxy_labels(), 3128)]
        ));
        assert!(none(
            &[policy(proxy_rule())],
            &[service(
                "sys",
                json!({"app.kubernetes.io/name": "other"}),
                3128
            )]
        ));
        assert!(none(
            &[policy(proxy_rule())],
            &[service("sys", proxy_labels(), 8080)]
        ));
        // A Service without a node endpoint cannot be reached on this node.
        let mut bare = svc.clone();
        bare["metadata"]["annotations"] = json!({});
        assert!(none(&[policy(proxy_rule())], &[bare]));
        // Selectors the node cannot evaluate allow nothing.
        let mut exprs = policy(proxy_rule());
        exprs["spec"]["podSelector"] =
            json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]});
        assert!(none(&[exprs], std::slice::from_ref(&svc)));
        // A policy in another namespace does not apply.
        let mut foreign = policy(proxy_rule());
        foreign["metadata"]["namespace"] = json!("other");
        assert!(none(&[foreign], &[svc]));
    }

    #[test]
    fn namespace_labels_come_from_the_namespace_objects() {
        let mut rule = proxy_rule();
        rule[0]["to"][0]["namespaceSelector"] = json!({"matchLabels": {"team": "infra"}});
        let svc = service("sys", proxy_labels(), 3128);
        let ns = json!({"metadata": {"name": "sys", "labels": {"team": "infra"}}});
        assert_eq!(
            allowed_destinations(
                &pod(),
                &[policy(rule.clone())],
                &[ns],
                std::slice::from_ref(&svc)
            )
            .len(),
            1
        );
        assert!(allowed_destinations(&pod(), &[policy(rule)], &[], &[svc]).is_empty());
    }

    #[test]
    fn only_a_policy_with_egress_peers_makes_the_node_look_further() {
        assert!(may_reach_services(&pod(), &[policy(proxy_rule())]));
        assert!(!may_reach_services(&pod(), &[policy(json!([]))]));
        assert!(!may_reach_services(&pod(), &[]));
        let mut other = policy(proxy_rule());
        other["spec"]["podSelector"] = json!({"matchLabels": {"protobot.dev/run": "r2"}});
        assert!(!may_reach_services(&pod(), &[other]));
    }

    #[test]
    fn endpoints_are_host_and_port() {
        assert_eq!(parse_endpoint("127.0.0.1:9"), Some(("127.0.0.1".into(), 9)));
        assert_eq!(parse_endpoint("[::1]:9"), Some(("::1".into(), 9)));
        assert_eq!(parse_endpoint("127.0.0.1:0"), None);
        assert_eq!(parse_endpoint("127.0.0.1"), None);
        assert_eq!(parse_endpoint(":80"), None);
    }
}
