//! Every 4xx the operator receives from the API server is said out loud: a warning naming
//! the verb, the resource and the object, and a count in
//! `protobot_reconcile_errors_total{controller="kube-api",category="<reason>"}`. A refused
//! call (a verb the chart's RBAC does not grant, an object the server's validation
//! rejects) must never be a silent debug line while the work does not happen.
//!
//! Two answers are the protocol rather than failures and are logged at debug, though still
//! counted: 404 on a read (an absence check) and 409 (an optimistic-concurrency conflict,
//! which every compare-and-swap of the work store expects to lose sometimes).
//!
//! It is a tower layer on the `kube::Client`, so it sees every call of every controller,
//! store and executor that uses the client, without each call site remembering to log.

use std::{
    sync::{Arc, OnceLock},
    task::{Context, Poll},
};

use futures::{FutureExt, future::BoxFuture};
use http::{Method, Request, Response, StatusCode};
use prometheus::IntCounterVec;

/// Where the counts go once the operator's registry exists (the client is built first).
#[derive(Clone, Debug, Default)]
pub struct ApiErrorSink {
    counter: Arc<OnceLock<IntCounterVec>>,
    /// The first refused calls (403), for tests and diagnostics.
    forbidden: Arc<std::sync::Mutex<Vec<ApiCall>>>,
}

/// How many refused calls a sink remembers.
const FORBIDDEN_KEPT: usize = 64;

impl ApiErrorSink {
    /// A sink that only logs until [`ApiErrorSink::count_into`] is called.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts from now on into `protobot_reconcile_errors_total` (`counter`).
    pub fn count_into(&self, counter: IntCounterVec) {
        let _ = self.counter.set(counter);
    }

    /// The calls the server refused with 403 so far (the first 64, each once): a verb the
    /// identity's RBAC does not grant.
    pub fn forbidden(&self) -> Vec<ApiCall> {
        self.forbidden.lock().map(|f| f.clone()).unwrap_or_default()
    }

    fn record(&self, call: &ApiCall, status: StatusCode) {
        let category = category(status);
        if status == StatusCode::FORBIDDEN
            && let Ok(mut kept) = self.forbidden.lock()
            && kept.len() < FORBIDDEN_KEPT
            && !kept
                .iter()
                .any(|k| k.verb == call.verb && k.resource == call.resource)
        {
            kept.push(call.clone());
        }
        if let Some(c) = self.counter.get() {
            c.with_label_values(&["kube-api", category]).inc();
        }
        let expected = status == StatusCode::CONFLICT
            || (status == StatusCode::NOT_FOUND && call.verb == "get");
        if expected {
            tracing::debug!(verb = call.verb, resource = %call.resource, object = %call.object, status = status.as_u16(), "the API server answered {category}");
        } else {
            tracing::warn!(
                verb = call.verb,
                resource = %call.resource,
                object = %call.object,
                status = status.as_u16(),
                "the API server refused {} {} {}: {}",
                call.verb,
                call.resource,
                call.object,
                status
            );
        }
    }
}

/// The stable label of a 4xx.
pub fn category(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "bad-request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not-found",
        405 => "method-not-allowed",
        409 => "conflict",
        410 => "gone",
        413 => "too-large",
        415 => "unsupported-media-type",
        422 => "invalid",
        429 => "too-many-requests",
        _ => "client-error",
    }
}

/// What a request asked for, in Kubernetes terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiCall {
    /// The API verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: &'static str,
    /// The resource, with its group and subresource (`buildworkitems.protobot.dev/status`).
    pub resource: String,
    /// `namespace/name`, `namespace/*` for collections, `name` for cluster objects.
    pub object: String,
}

/// Reads the verb, resource and object of a request to the API server (pure).
pub fn describe(method: &Method, path: &str, query: Option<&str>) -> ApiCall {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => ("", &parts[..0]),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub, ..] => (*plural, Some(*name), Some(*sub)),
        [] => (path, None, None),
    };
    let watching =
        query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match (method.as_str(), name.is_some()) {
        ("GET", _) if watching => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    };
    let mut resource = plural.to_owned();
    if !group.is_empty() {
        resource = format!("{resource}.{group}");
    }
    if let Some(sub) = sub {
        resource = format!("{resource}/{sub}");
    }
    let object = match (namespace, name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (Some(ns), None) => format!("{ns}/*"),
        (None, Some(n)) => n.to_owned(),
        (None, None) => "*".to_owned(),
    };
    ApiCall {
        verb,
        resource,
        object,
    }
}

/// The tower layer.
#[derive(Clone, Debug)]
pub struct ApiErrorLayer {
    sink: ApiErrorSink,
}

impl ApiErrorLayer {
    /// Reports into `sink`.
    pub fn new(sink: ApiErrorSink) -> Self {
        Self { sink }
    }
}

impl<S> tower::Layer<S> for ApiErrorLayer {
    type Service = ApiErrorService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiErrorService {
            inner,
            sink: self.sink.clone(),
        }
    }
}

/// The service the layer wraps around the client's stack.
#[derive(Clone, Debug)]
pub struct ApiErrorService<S> {
    inner: S,
    sink: ApiErrorSink,
}

impl<S, B, RB> tower::Service<Request<B>> for ApiErrorService<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<RB>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let call = describe(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        let sink = self.sink.clone();
        self.inner
            .call(request)
            .map(move |result| {
                if let Ok(response) = &result
                    && response.status().is_client_error()
                {
                    sink.record(&call, response.status());
                }
                result
            })
            .boxed()
    }
}

/// A client for `config` whose 4xx answers are reported through `sink`.
pub fn client(config: kube::Config, sink: &ApiErrorSink) -> Result<kube::Client, kube::Error> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&ApiErrorLayer::new(sink.clone()))
        .build())
}

/// [`client`] for the inferred configuration (in-cluster, or `KUBECONFIG`).
pub async fn infer_client(sink: &ApiErrorSink) -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    client(config, sink)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_its_verb_resource_and_object() {
        let d = |m: Method, p: &str, q: Option<&str>| describe(&m, p, q);
        assert_eq!(
            d(
                Method::PATCH,
                "/apis/protobot.dev/v1alpha1/namespaces/team-a/buildworkitems/wi-1",
                None
            ),
            ApiCall {
                verb: "patch",
                resource: "buildworkitems.protobot.dev".into(),
                object: "team-a/wi-1".into()
            }
        );
        assert_eq!(
            d(
                Method::PUT,
                "/apis/protobot.dev/v1alpha1/namespaces/team-a/buildworkitems/wi-1/status",
                None
            )
            .resource,
            "buildworkitems.protobot.dev/status"
        );
        let log = d(
            Method::GET,
            "/api/v1/namespaces/ns/pods/p/log",
            Some("container=c"),
        );
        assert_eq!((log.verb, log.resource.as_str()), ("get", "pods/log"));
        let del = d(
            Method::DELETE,
            "/api/v1/namespaces/ns/configmaps",
            Some("labelSelector=a"),
        );
        assert_eq!(
            (del.verb, del.object.as_str()),
            ("deletecollection", "ns/*")
        );
        let watch = d(
            Method::GET,
            "/apis/protobot.dev/v1alpha1/changesets",
            Some("watch=true&resourceVersion=1"),
        );
        assert_eq!((watch.verb, watch.object.as_str()), ("watch", "*"));
        let ns = d(Method::GET, "/api/v1/namespaces/team-a", None);
        assert_eq!(
            (ns.verb, ns.resource.as_str(), ns.object.as_str()),
            ("get", "namespaces", "team-a")
        );
        // Nothing a server could send in a path panics the description.
        for p in ["", "/", "/api", "/apis/x", "//////", "/api/v1/namespaces"] {
            let _ = d(Method::GET, p, None);
        }
    }

    #[test]
    fn four_hundreds_have_stable_categories() {
        assert_eq!(category(StatusCode::FORBIDDEN), "forbidden");
        assert_eq!(category(StatusCode::UNPROCESSABLE_ENTITY), "invalid");
        assert_eq!(category(StatusCode::PAYLOAD_TOO_LARGE), "too-large");
        assert_eq!(category(StatusCode::IM_A_TEAPOT), "client-error");
    }

    #[tokio::test]
    async fn a_refused_call_is_counted_by_category() {
        use tower::{Layer, Service, ServiceExt};
        let counter = IntCounterVec::new(
            prometheus::Opts::new("protobot_reconcile_errors_total", "t"),
            &["controller", "category"],
        )
        .unwrap();
        let sink = ApiErrorSink::new();
        sink.count_into(counter.clone());
        let layer = ApiErrorLayer::new(sink.clone());
        let inner = tower::service_fn(|req: Request<()>| async move {
            let status = if req.method() == Method::PATCH {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::OK
            };
            Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap())
        });
        let mut svc = layer.layer(inner);
        for method in [Method::PATCH, Method::GET, Method::PATCH] {
            let req = Request::builder()
                .method(method)
                .uri("/apis/protobot.dev/v1alpha1/namespaces/a/buildworkitems/x")
                .body(())
                .unwrap();
            svc.ready().await.unwrap().call(req).await.unwrap();
        }
        assert_eq!(
            counter.with_label_values(&["kube-api", "forbidden"]).get(),
            2
        );
    }
}
