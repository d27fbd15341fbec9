//! Legacy discovery documents: `/api`, `/apis`, `/apis/<group>`, `/api/v1` and
//! `/apis/<group>/<version>`, rendered from the [`TypeRegistry`].

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::resources::TypeRegistry;

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `GET /api`: the core `APIVersions`.
pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
    })
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

/// Kubernetes version priority: GA > beta > alpha, then higher numbers first;
/// versions that do not look like Kubernetes versions sort last, by name.
fn version_priority(v: &str) -> (u8, u64, u64) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let Ok(major) = digits.parse::<u64>() else {
        return (0, 0, 0);
    };
    let tail = &rest[digits.len()..];
    let (rank, minor) = if tail.is_empty() {
        (3, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n.parse().unwrap_or(0))
    } else {
        return (0, 0, 0);
    };
    (rank, major, minor)
}

fn groups(reg: &TypeRegistry) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in reg.all().filter(|t| !t.group.is_empty()) {
        let entry = groups.entry(t.group.clone()).or_default();
        for v in &t.versions {
            if !entry.contains(v) {
                entry.push(v.clone());
            }
        }
    }
    for versions in groups.values_mut() {
        versions.sort_by(|a, b| {
            version_priority(b)
                .cmp(&version_priority(a))
                .then_with(|| a.cmp(b))
        });
    }
    groups
}

/// `GET /apis`: the `APIGroupList`.
pub fn group_list(reg: &TypeRegistry) -> Value {
    let groups: Vec<Value> = groups(reg)
        .iter()
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<group>`: one `APIGroup`, if served.
pub fn group(reg: &TypeRegistry, group: &str) -> Option<Value> {
    groups(reg).get(group).map(|vs| group_json(group, vs))
}

fn aggregated_group(reg: &TypeRegistry, group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|version| {
            let resources: Vec<Value> = reg
                .all()
                .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
                .map(|t| {
                    let gvk = json!({"group": group, "version": version, "kind": t.kind});
                    let subresources: Vec<Value> = t
                        .subresources()
                        .into_iter()
                        .map(|sub| {
                            let verbs: &[&str] = if sub == "log" {
                                &["get"]
                            } else {
                                &["get", "patch", "update"]
                            };
                            json!({"subresource": sub, "responseKind": gvk, "verbs": verbs})
                        })
                        .collect();
                    json!({
                        "resource": t.plural,
                        "responseKind": gvk,
                        "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": t.singular,
                        "verbs": VERBS,
                        "shortNames": t.short_names,
                        "subresources": subresources,
                    })
                })
                .collect();
            json!({"version": version, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group}, "versions": versions})
}

/// Aggregated discovery (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`):
/// the core group for `/api`, every other group for `/apis`.
pub fn aggregated(reg: &TypeRegistry, core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group(reg, "", &["v1".to_owned()])]
    } else {
        groups(reg)
            .iter()
            .map(|(g, vs)| aggregated_group(reg, g, vs))
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

/// Whether an `Accept` header asks for aggregated discovery.
pub fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| {
        first.contains("as=APIGroupDiscoveryList") && first.contains("g=apidiscovery.k8s.io")
    })
}

/// `GET /api/v1` or `GET /apis/<group>/<version>`: the `APIResourceList`, if served.
pub fn resource_list(reg: &TypeRegistry, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for t in reg
        .all()
        .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
    {
        resources.push(json!({
            "name": t.plural,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": VERBS,
            "shortNames": t.short_names,
        }));
        for sub in t.subresources() {
            let verbs: &[&str] = if sub == "log" {
                &["get"]
            } else {
                &["get", "patch", "update"]
            };
            resources.push(json!({
                "name": format!("{}/{sub}", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": verbs,
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_by_kubernetes_priority() {
        let mut vs = vec!["v1alpha1", "v2beta1", "v1", "v1beta2", "v2", "foo"];
        vs.sort_by(|a, b| {
            version_priority(b)
                .cmp(&version_priority(a))
                .then_with(|| a.cmp(b))
        });
        assert_eq!(vs, ["v2", "v1", "v2beta1", "v1beta2", "v1alpha1", "foo"]);
    }
}
