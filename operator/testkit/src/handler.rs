//! Verb dispatch: one HTTP request in, one response out. Parses the route and
//! query, applies injected faults, and maps each verb onto the [`State`] with
//! the real server's status codes and `Status` bodies.

use std::{sync::Arc, time::Duration};

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::{
    body::ResponseBody,
    discovery,
    error::ApiError,
    faults::Verb,
    managed::Scope,
    record::RecordedRequest,
    resources::ResourceType,
    route::{Query, Route, Target, parse_path},
    selector::{FieldSelector, LabelSelector},
    server::Shared,
    store::{DeleteOptions, PatchKind, Propagation, Writer},
    watch::{self, Start, WatchParams},
};

type Resp = Response<ResponseBody>;

fn json_response(code: u16, value: &Value) -> Resp {
    let mut resp = Response::new(ResponseBody::full(value.to_string()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn aggregated_response(value: &Value) -> Resp {
    let mut resp = json_response(200, value);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        ),
    );
    resp
}

fn error_response(err: &ApiError) -> Resp {
    json_response(err.code, &err.to_status())
}

fn text_response(text: String) -> Resp {
    let mut resp = Response::new(ResponseBody::full(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    resp
}

/// Serve one request.
pub async fn handle<B>(shared: Arc<Shared>, req: Request<B>) -> Resp
where
    B: http_body::Body + Send,
    B::Error: std::fmt::Display,
{
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error_response(&ApiError::bad_request(format!("failed to read body: {e}")));
        }
    };
    let query = Query::parse(parts.uri.query());
    let Some(route) = parse_path(parts.uri.path()) else {
        return error_response(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let user_agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_owned();
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let ctx = Ctx {
        accept,
        shared,
        method: parts.method,
        query,
        body: body.to_vec(),
        content_type,
        user_agent,
    };
    match ctx.route(route).await {
        Ok(resp) => resp,
        Err(err) => error_response(&err),
    }
}

struct Ctx {
    accept: String,
    shared: Arc<Shared>,
    method: Method,
    query: Query,
    body: Vec<u8>,
    content_type: String,
    user_agent: String,
}

/// An object as served at `version`, or as `PartialObjectMetadata` when the
/// client asked for metadata only.
pub fn present(rt: &ResourceType, version: &str, obj: &Value, metadata_only: bool) -> Value {
    if metadata_only {
        return json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        });
    }
    let mut out = obj.clone();
    out["apiVersion"] = json!(rt.api_version(version));
    out
}

fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))
}

fn encode_continue(rv: u64, last: &str) -> String {
    format!("{rv}:{last}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Result<(u64, String), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid: invalid continue token");
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2).unwrap_or("zz"), 16))
        .collect();
    let text = String::from_utf8(bytes.map_err(|_| bad())?).map_err(|_| bad())?;
    let (rv, last) = text.split_once(':').ok_or_else(bad)?;
    Ok((rv.parse().map_err(|_| bad())?, last.to_owned()))
}

impl Ctx {
    /// `Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`.
    fn metadata_only(&self) -> bool {
        self.accept
            .split(',')
            .next()
            .is_some_and(|first| first.contains("as=PartialObjectMetadata"))
    }

    fn verb(&self, t: &Target) -> Result<Verb, ApiError> {
        Ok(match (&self.method, t.name.is_some()) {
            (&Method::GET, true) => Verb::Get,
            (&Method::GET, false) if self.query.flag("watch") => Verb::Watch,
            (&Method::GET, false) => Verb::List,
            (&Method::POST, false) => Verb::Create,
            (&Method::PUT, true) => Verb::Update,
            (&Method::PATCH, true) => Verb::Patch,
            (&Method::DELETE, true) => Verb::Delete,
            (&Method::DELETE, false) => Verb::DeleteCollection,
            (m, _) => {
                return Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource ({m})"
                )));
            }
        })
    }

    async fn route(self, route: Route) -> Result<Resp, ApiError> {
        let types = self.shared.lock().types.clone();
        let not_found = || {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        };
        match route {
            Route::Version => Ok(json_response(
                200,
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-testkit", "platform": "linux/amd64"}),
            )),
            Route::CoreVersions if discovery::wants_aggregated(&self.accept) => {
                Ok(aggregated_response(&discovery::aggregated(&types, true)))
            }
            Route::GroupList if discovery::wants_aggregated(&self.accept) => {
                Ok(aggregated_response(&discovery::aggregated(&types, false)))
            }
            Route::CoreVersions => Ok(json_response(200, &discovery::core_versions())),
            Route::GroupList => Ok(json_response(200, &discovery::group_list(&types))),
            Route::Group(g) => discovery::group(&types, &g)
                .map(|v| json_response(200, &v))
                .ok_or_else(not_found),
            Route::ResourceList { group, version } => {
                discovery::resource_list(&types, &group, &version)
                    .map(|v| json_response(200, &v))
                    .ok_or_else(not_found)
            }
            Route::Resource(t) => {
                let rt = types
                    .lookup(&t.group, &t.version, &t.plural)
                    .cloned()
                    .ok_or_else(not_found)?;
                if t.namespace.is_some() && !rt.namespaced {
                    return Err(not_found());
                }
                self.resource(rt, t).await
            }
        }
    }

    async fn resource(self, rt: ResourceType, t: Target) -> Result<Resp, ApiError> {
        let verb = self.verb(&t)?;
        let record = RecordedRequest {
            verb,
            group: t.group.clone(),
            version: t.version.clone(),
            plural: t.plural.clone(),
            namespace: t.namespace.clone(),
            name: t.name.clone(),
            subresource: t.subresource.clone(),
            field_manager: self.query.get("fieldManager").map(str::to_owned),
            force: self.query.flag("force"),
            patch_type: (self.method == Method::PATCH).then(|| {
                self.content_type
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            }),
            body: if self.body.is_empty() {
                None
            } else {
                self.json_body().ok()
            },
            code: 0,
        };
        let shared = self.shared.clone();
        let result = self.serve(rt, t, verb).await;
        let code = match &result {
            Ok(resp) => resp.status().as_u16(),
            Err(e) => e.code,
        };
        shared.record(RecordedRequest { code, ..record });
        result
    }

    async fn serve(self, rt: ResourceType, t: Target, verb: Verb) -> Result<Resp, ApiError> {
        let faults = self
            .shared
            .faults
            .trigger(verb, &t.plural, t.name.as_deref());
        if !faults.latency.is_zero() {
            tokio::time::sleep(faults.latency).await;
        }
        if let Some(code) = faults.status {
            return Err(match code {
                409 => ApiError::conflict(&rt, t.name.as_deref().unwrap_or("")),
                500 => ApiError::internal("testkit: injected internal error"),
                503 => ApiError::new(
                    503,
                    "ServiceUnavailable",
                    "testkit: injected unavailability",
                ),
                429 => ApiError::new(429, "TooManyRequests", "testkit: injected throttling"),
                code => ApiError::new(
                    code,
                    "InjectedFault",
                    format!("testkit: injected status {code}"),
                ),
            });
        }
        let scope = match t.subresource.as_deref() {
            None => Scope::Main {
                status_subresource: rt.status_subresource,
            },
            Some("status") if rt.status_subresource => Scope::Status,
            Some("log") if rt.group.is_empty() && rt.plural == "pods" && verb == Verb::Get => {
                return self.pod_log(&t);
            }
            Some(_) => {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ));
            }
        };
        let ns = t.namespace.clone().unwrap_or_default();
        if rt.namespaced && t.name.is_some() && t.namespace.is_none() {
            return Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        let name = t.name.clone().unwrap_or_default();
        let manager_param = self.query.get("fieldManager").map(str::to_owned);
        let manager = manager_param
            .clone()
            .unwrap_or_else(|| self.user_agent.clone());
        let writer = Writer {
            manager: &manager,
            scope,
            dry_run: self.query.get("dryRun") == Some("All"),
        };
        let result = match verb {
            Verb::Get => {
                let obj = self.shared.lock().get(&rt, &ns, &name)?;
                return Ok(json_response(
                    200,
                    &present(&rt, &t.version, &obj, self.metadata_only()),
                ));
            }
            Verb::List => return self.list(&rt, &t),
            Verb::Watch => return self.watch(rt, &t, faults.cut_watch),
            Verb::Create => {
                let body = self.json_body()?;
                let obj = self
                    .shared
                    .lock()
                    .create(&rt, &t.version, &ns, body, &writer)?;
                (201, obj)
            }
            Verb::Update => {
                let body = self.json_body()?;
                let obj = self
                    .shared
                    .lock()
                    .replace(&rt, &t.version, &ns, &name, body, &writer)?;
                (200, obj)
            }
            Verb::Patch => {
                let kind = match self.content_type.split(';').next().unwrap_or("").trim() {
                    "application/merge-patch+json" => PatchKind::Merge,
                    "application/strategic-merge-patch+json" => PatchKind::StrategicMerge,
                    "application/json-patch+json" => PatchKind::Json,
                    "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                        PatchKind::Apply {
                            force: self.query.flag("force"),
                        }
                    }
                    other => return Err(ApiError::unsupported_media_type(other)),
                };
                let body = self.json_body()?;
                let writer = Writer {
                    manager: if matches!(kind, PatchKind::Apply { .. }) {
                        manager_param.as_deref().unwrap_or("")
                    } else {
                        &manager
                    },
                    ..writer
                };
                let mut state = self.shared.lock();
                let existed = state.get(&rt, &ns, &name).is_ok();
                let obj = state.patch(&rt, &t.version, &ns, &name, kind, body, &writer)?;
                (if existed { 200 } else { 201 }, obj)
            }
            Verb::Delete => {
                let opts = self.delete_options()?;
                let (obj, gone) = self.shared.lock().delete(&rt, &ns, &name, &opts)?;
                self.shared.notify();
                let is_pod = rt.group.is_empty() && rt.plural == "pods";
                if gone && !is_pod {
                    let uid = obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
                    return Ok(json_response(
                        200,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": uid}}),
                    ));
                }
                // Deletion that is not complete yet (finalizers, graceful pods) is 202 Accepted.
                (202, obj)
            }
            Verb::DeleteCollection => {
                let opts = self.delete_options()?;
                let labels = LabelSelector::parse(self.query.get("labelSelector").unwrap_or(""))?;
                let fields = FieldSelector::parse(self.query.get("fieldSelector").unwrap_or(""))?;
                let mut state = self.shared.lock();
                let (items, rv) = state.list(&rt, t.namespace.as_deref(), &labels, &fields);
                let mut out = Vec::new();
                for (key, _) in items {
                    if let Ok((obj, _)) = state.delete(&rt, &key.namespace, &key.name, &opts) {
                        out.push(present(&rt, &t.version, &obj, self.metadata_only()));
                    }
                }
                drop(state);
                self.shared.notify();
                return Ok(json_response(200, &self.list_json(&rt, &t, out, rv, None)));
            }
        };
        self.shared.notify();
        Ok(json_response(
            result.0,
            &present(&rt, &t.version, &result.1, self.metadata_only()),
        ))
    }

    fn json_body(&self) -> Result<Value, ApiError> {
        if self
            .content_type
            .starts_with("application/vnd.kubernetes.protobuf")
        {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                "testkit serves JSON and YAML only; protobuf request bodies (kubectl's default for built-in kinds) are not supported",
            ));
        }
        if let Ok(v) = serde_json::from_slice::<Value>(&self.body) {
            return Ok(v);
        }
        let text = std::str::from_utf8(&self.body)
            .map_err(|_| ApiError::bad_request("request body is not UTF-8"))?;
        serde_yaml_ng::from_str::<Value>(text)
            .map_err(|e| ApiError::bad_request(format!("failed to decode request body: {e}")))
    }

    fn delete_options(&self) -> Result<DeleteOptions, ApiError> {
        let body = if self.body.is_empty() {
            json!({})
        } else {
            self.json_body()?
        };
        let policy = body
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .or_else(|| self.query.get("propagationPolicy"));
        let propagation = match policy {
            None => None,
            Some("Background") => Some(Propagation::Background),
            Some("Foreground") => Some(Propagation::Foreground),
            Some("Orphan") => Some(Propagation::Orphan),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "invalid propagationPolicy {other:?}"
                )));
            }
        };
        let grace = body
            .get("gracePeriodSeconds")
            .and_then(Value::as_i64)
            .or_else(|| {
                self.query
                    .get("gracePeriodSeconds")
                    .and_then(|g| g.parse().ok())
            });
        Ok(DeleteOptions {
            propagation,
            grace_period_seconds: grace,
            uid: body
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(str::to_owned),
            resource_version: body
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    fn list_json(
        &self,
        rt: &ResourceType,
        t: &Target,
        items: Vec<Value>,
        rv: u64,
        cont: Option<(String, usize)>,
    ) -> Value {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some((token, remaining)) = cont {
            meta["continue"] = json!(token);
            meta["remainingItemCount"] = json!(remaining);
        }
        let (api_version, kind) = if self.metadata_only() {
            (
                "meta.k8s.io/v1".to_owned(),
                "PartialObjectMetadataList".to_owned(),
            )
        } else {
            (rt.api_version(&t.version), format!("{}List", rt.kind))
        };
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": meta,
            "items": items,
        })
    }

    fn list(&self, rt: &ResourceType, t: &Target) -> Result<Resp, ApiError> {
        let labels = LabelSelector::parse(self.query.get("labelSelector").unwrap_or(""))?;
        let fields = FieldSelector::parse(self.query.get("fieldSelector").unwrap_or(""))?;
        let state = self.shared.lock();
        let current = state.resource_version();
        if let Some(rv) = self.query.get("resourceVersion").filter(|rv| *rv != "0") {
            let rv = parse_rv(rv)?;
            match self.query.get("resourceVersionMatch") {
                Some("Exact") if rv != current => {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({current}); testkit only serves exact lists at the latest resourceVersion"
                    )));
                }
                _ if rv > current => {
                    return Err(ApiError::new(
                        504,
                        "Timeout",
                        format!("Too large resource version: {rv}, current: {current}"),
                    )
                    .with_causes(vec![crate::error::Cause {
                        reason: "ResourceVersionTooLarge".to_owned(),
                        message: "Too large resource version".to_owned(),
                        field: String::new(),
                    }]));
                }
                _ => {}
            }
        }
        let (items, rv) = state.list(rt, t.namespace.as_deref(), &labels, &fields);
        drop(state);
        let (list_rv, after) = match self.query.get("continue") {
            Some(token) => {
                let (rv, last) = decode_continue(token)?;
                if rv < self.shared.lock().compacted_rv() {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                (rv, Some(last))
            }
            None => (rv, None),
        };
        let mut items: Vec<(String, Value)> = items
            .into_iter()
            .map(|(k, v)| (format!("{}/{}", k.namespace, k.name), v))
            .filter(|(k, _)| after.as_ref().is_none_or(|a| k > a))
            .collect();
        let limit = self
            .query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0);
        let mut cont = None;
        if let Some(limit) = limit
            && items.len() > limit
        {
            let remaining = items.len() - limit;
            items.truncate(limit);
            if let Some((last, _)) = items.last() {
                cont = Some((encode_continue(list_rv, last), remaining));
            }
        }
        let items = items
            .into_iter()
            .map(|(_, v)| present(rt, &t.version, &v, self.metadata_only()))
            .collect();
        Ok(json_response(
            200,
            &self.list_json(rt, t, items, list_rv, cont),
        ))
    }

    fn watch(
        &self,
        rt: ResourceType,
        t: &Target,
        cut_after: Option<(usize, crate::faults::WatchCut)>,
    ) -> Result<Resp, ApiError> {
        let labels = LabelSelector::parse(self.query.get("labelSelector").unwrap_or(""))?;
        let fields = FieldSelector::parse(self.query.get("fieldSelector").unwrap_or(""))?;
        let send_initial_events = self.query.flag("sendInitialEvents");
        let start = match self.query.get("resourceVersion") {
            None | Some("0") => Start::Initial,
            Some(_) if send_initial_events => Start::Initial,
            Some(rv) => Start::After(parse_rv(rv)?),
        };
        if send_initial_events && !self.query.flag("allowWatchBookmarks") {
            return Err(ApiError::invalid(
                &rt,
                "",
                vec![crate::error::Cause {
                    reason: "FieldValueForbidden".to_owned(),
                    message:
                        "Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true"
                            .to_owned(),
                    field: "allowWatchBookmarks".to_owned(),
                }],
            ));
        }
        let timeout = self
            .query
            .get("timeoutSeconds")
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(self.shared.config.default_watch_timeout);
        let params = WatchParams {
            start,
            bookmarks: self.query.flag("allowWatchBookmarks"),
            send_initial_events,
            timeout,
            namespace: t.namespace.clone(),
            labels,
            fields,
            version: t.version.clone(),
            metadata_only: self.metadata_only(),
            cut_after,
        };
        let body = watch::spawn(self.shared.clone(), rt, params);
        let mut resp = Response::new(body);
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        Ok(resp)
    }

    fn pod_log(&self, t: &Target) -> Result<Resp, ApiError> {
        let ns = t.namespace.clone().unwrap_or_default();
        let name = t.name.clone().unwrap_or_default();
        let container = self.query.get("container").map(str::to_owned);
        let text = self.shared.pod_log(&ns, &name, container.as_deref())?;
        Ok(text_response(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "ns/name-1");
        assert_eq!(decode_continue(&t).unwrap(), (42, "ns/name-1".to_owned()));
        assert_eq!(decode_continue("zz").unwrap_err().code, 400);
    }
}
