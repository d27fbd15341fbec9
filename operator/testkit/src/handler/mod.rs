//! Verb dispatch: one HTTP request in, one response out. Parses the route and
//! query, applies injected faults, records the request, and maps each verb onto
//! the store with the real server's status codes and `Status` bodies. Lists
//! live in `list`, watches and pod logs in `watch`, response shapes in `response`.

mod list;
mod response;
mod watch;

use std::sync::Arc;

use http::{Method, Request, Response, header};
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
};

pub use response::present;
use response::{aggregated_response, error_response, json_response};

type Resp = Response<ResponseBody>;

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

pub(super) struct Ctx {
    pub(super) accept: String,
    pub(super) shared: Arc<Shared>,
    pub(super) method: Method,
    pub(super) query: Query,
    pub(super) body: Vec<u8>,
    pub(super) content_type: String,
    pub(super) user_agent: String,
}

impl Ctx {
    /// `Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`.
    pub(super) fn metadata_only(&self) -> bool {
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
            strict: self.query.get("fieldValidation") == Some("Strict"),
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

    pub(super) fn json_body(&self) -> Result<Value, ApiError> {
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
}
