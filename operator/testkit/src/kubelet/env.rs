//! Container environment as the kubelet builds it: `envFrom` (ConfigMap and
//! Secret), then `env` with literal values and `valueFrom` (`configMapKeyRef`,
//! `secretKeyRef`, `fieldRef`), with `$(VAR)` expansion of earlier variables.

use serde_json::Value;

use super::{backend::Lookup, volumes::decode_base64};

fn source(shared: &Lookup, plural: &str, namespace: &str, name: &str) -> Option<Value> {
    shared.object(plural, namespace, name)
}

fn data(obj: &Value, secret: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(d) = obj.get("data").and_then(Value::as_object) {
        for (k, v) in d {
            let s = v.as_str().unwrap_or("");
            let value = if secret {
                decode_base64(s).map(|b| String::from_utf8_lossy(&b).into_owned())
            } else {
                Some(s.to_owned())
            };
            if let Some(value) = value {
                out.push((k.clone(), value));
            }
        }
    }
    if let Some(d) = obj.get("stringData").and_then(Value::as_object) {
        for (k, v) in d {
            out.push((k.clone(), v.as_str().unwrap_or("").to_owned()));
        }
    }
    out
}

fn field_ref(pod: &Value, path: &str) -> Option<String> {
    if let Some(label) = path
        .strip_prefix("metadata.labels['")
        .and_then(|r| r.strip_suffix("']"))
    {
        return pod
            .pointer("/metadata/labels")?
            .get(label)?
            .as_str()
            .map(str::to_owned);
    }
    if let Some(ann) = path
        .strip_prefix("metadata.annotations['")
        .and_then(|r| r.strip_suffix("']"))
    {
        return pod
            .pointer("/metadata/annotations")?
            .get(ann)?
            .as_str()
            .map(str::to_owned);
    }
    let v = pod.pointer(&format!("/{}", path.replace('.', "/")))?;
    Some(match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// Expand `$(NAME)` references to variables defined earlier; `$$` escapes. The kubelet does
/// this to env values, and to a container's `command` and `args` with its whole environment.
pub fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail.strip_prefix("$$") {
            out.push('$');
            rest = t;
        } else if let Some(end) = tail.strip_prefix("$(").and_then(|t| t.find(')')) {
            let name = &tail[2..2 + end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&tail[..3 + end]),
            }
            rest = &tail[3 + end..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

fn key_ref(
    shared: &Lookup,
    namespace: &str,
    r: &Value,
    plural: &str,
) -> Result<Option<String>, String> {
    let name = r.get("name").and_then(Value::as_str).unwrap_or("");
    let key = r.get("key").and_then(Value::as_str).unwrap_or("");
    let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
    let found = source(shared, plural, namespace, name).and_then(|o| {
        data(&o, plural == "secrets")
            .into_iter()
            .find(|(k, _)| k == key)
    });
    match found {
        Some((_, v)) => Ok(Some(v)),
        None if optional => Ok(None),
        None => Err(format!(
            "couldn't find key {key} in {plural} {namespace}/{name}"
        )),
    }
}

/// The container's environment, or why it cannot be built
/// (`CreateContainerConfigError` on a real node).
pub fn build(
    shared: &Lookup,
    pod: &Value,
    container: &Value,
) -> Result<Vec<(String, String)>, String> {
    let namespace = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut env: Vec<(String, String)> = Vec::new();
    for from in container
        .get("envFrom")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let prefix = from.get("prefix").and_then(Value::as_str).unwrap_or("");
        for (plural, field) in [("configmaps", "configMapRef"), ("secrets", "secretRef")] {
            let Some(r) = from.get(field) else { continue };
            let name = r.get("name").and_then(Value::as_str).unwrap_or("");
            let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
            match source(shared, plural, namespace, name) {
                Some(obj) => {
                    for (k, v) in data(&obj, plural == "secrets") {
                        env.push((format!("{prefix}{k}"), v));
                    }
                }
                None if optional => {}
                None => return Err(format!("{plural} \"{name}\" not found")),
            }
        }
    }
    for e in container
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = e.get("name").and_then(Value::as_str) else {
            continue;
        };
        let value = if let Some(v) = e.get("value").and_then(Value::as_str) {
            Some(expand(v, &env))
        } else if let Some(r) = e.pointer("/valueFrom/configMapKeyRef") {
            key_ref(shared, namespace, r, "configmaps")?
        } else if let Some(r) = e.pointer("/valueFrom/secretKeyRef") {
            key_ref(shared, namespace, r, "secrets")?
        } else if let Some(path) = e
            .pointer("/valueFrom/fieldRef/fieldPath")
            .and_then(Value::as_str)
        {
            Some(field_ref(pod, path).unwrap_or_default())
        } else {
            Some(String::new())
        };
        if let Some(v) = value {
            env.push((name.to_owned(), v));
        }
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn dependent_variables_expand() {
        let env = vec![("A".to_owned(), "x".to_owned())];
        assert_eq!(expand("$(A)-$(B)-$$(A)", &env), "x-$(B)-$(A)");
    }

    #[test]
    fn field_refs_read_the_pod() {
        let pod =
            json!({"metadata": {"name": "p", "labels": {"app": "web"}}, "spec": {"nodeName": "n"}});
        assert_eq!(field_ref(&pod, "metadata.name").as_deref(), Some("p"));
        assert_eq!(field_ref(&pod, "spec.nodeName").as_deref(), Some("n"));
        assert_eq!(
            field_ref(&pod, "metadata.labels['app']").as_deref(),
            Some("web")
        );
    }
}
