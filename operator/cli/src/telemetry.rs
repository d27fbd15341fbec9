//! Where the process's `tracing` goes: JSON logs for the long-running services (`protobot
//! operator`, `protobot egress-proxy`) and, when the standard OpenTelemetry variables ask for it,
//! OTLP export of the same spans (docs/tracing.md). The core crates only create spans; this
//! shell module alone decides where they go.
//!
//! Pure: [`OtlpConfig::from_env`] reads the variables through a lookup function and decides
//! (nothing set → no export; a value it cannot honour → an error that says what to set).
//! Effects: [`init_service`] and [`init_command`] install the subscriber, and the returned
//! [`Telemetry`] flushes and stops the exporter when it is shut down or dropped, so a
//! short-lived `protobot demo` loses no span at exit.
//!
//! Only spans are exported, never events: a span carries the attributes its call site declares
//! (ids, roles, cycles, outcomes), while log events may quote a Worker's output; keeping
//! events out of the export is what guarantees no prompt, completion or credential text
//! reaches a collector.

use std::{
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use tracing_subscriber::{Layer, layer::SubscriberExt, util::SubscriberInitExt};

/// The service name spans carry when `OTEL_SERVICE_NAME` is not set.
pub(crate) const DEFAULT_SERVICE_NAME: &str = "protobot";

/// The OTLP request timeout when `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` is not set (the
/// specification's default).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how to export traces, decided from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OtlpConfig {
    /// The full OTLP/HTTP traces URL (`…/v1/traces`).
    pub(crate) endpoint: String,
    /// `service.name` of every span.
    pub(crate) service_name: String,
    /// Timeout of one export request.
    pub(crate) timeout: Duration,
}

/// A variable the exporter cannot honour. The process runs on without export.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum OtlpConfigError {
    /// The endpoint is not a plain `http://` URL.
    #[error(
        "unable to export traces to {var}={value:?}: not an http:// URL; set it to the OTLP/HTTP address of a collector, e.g. http://127.0.0.1:4318 (https is not built in: run the collector beside the process)"
    )]
    Endpoint {
        /// The variable read.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A protocol other than `http/protobuf`.
    #[error(
        "unable to export traces with {var}={value:?}: this build speaks http/protobuf only; set it to http/protobuf and point the endpoint at the collector's OTLP/HTTP port (4318), or unset it"
    )]
    Protocol {
        /// The variable read.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A timeout that is not a whole number of milliseconds.
    #[error(
        "unable to export traces with {var}={value:?}: not a whole number of milliseconds; set it like 10000 or unset it"
    )]
    Timeout {
        /// The variable read.
        var: &'static str,
        /// Its value.
        value: String,
    },
}

impl OtlpConfig {
    /// Reads the standard variables through `var` (empty values count as unset): `None` when
    /// neither `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` nor `OTEL_EXPORTER_OTLP_ENDPOINT` is set, or
    /// when `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn export off.
    pub(crate) fn from_env(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, OtlpConfigError> {
        let var = |name: &str| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        // The signal's own endpoint is used as given; the generic one gets the signal's path.
        let (endpoint_var, endpoint) = if let Some(v) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", v)
        } else if let Some(v) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            let joined = format!("{}/v1/traces", v.trim_end_matches('/'));
            ("OTEL_EXPORTER_OTLP_ENDPOINT", joined)
        } else {
            return Ok(None);
        };
        let host = endpoint.strip_prefix("http://").unwrap_or_default();
        if host.is_empty() || host.starts_with('/') {
            return Err(OtlpConfigError::Endpoint {
                var: endpoint_var,
                value: var(endpoint_var).unwrap_or_default(),
            });
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(value) = var(name) {
                if value != "http/protobuf" {
                    return Err(OtlpConfigError::Protocol { var: name, value });
                }
                break;
            }
        }
        let mut timeout = DEFAULT_TIMEOUT;
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ] {
            if let Some(value) = var(name) {
                let ms: u64 = value
                    .parse()
                    .map_err(|_| OtlpConfigError::Timeout { var: name, value })?;
                timeout = Duration::from_millis(ms);
                break;
            }
        }
        Ok(Some(Self {
            endpoint,
            service_name: var("OTEL_SERVICE_NAME")
                .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
            timeout,
        }))
    }
}

/// The trace exporter of this process, if any: [`Telemetry::shutdown`] (or dropping it) exports
/// what is buffered and stops the exporter's thread.
#[must_use = "dropping the guard stops trace export"]
#[derive(Debug, Default)]
pub(crate) struct Telemetry {
    exporter: Option<Exporter>,
}

/// A running exporter: its provider, where it sends, and what went wrong on the way.
#[derive(Debug)]
struct Exporter {
    provider: SdkTracerProvider,
    endpoint: String,
    health: Arc<ExportHealth>,
}

/// Export requests that failed (no answer, or not a 2xx), counted by the client: the SDK
/// drops a failed batch silently, so this is how a run learns its trace is incomplete.
#[derive(Debug, Default)]
struct ExportHealth {
    failures: AtomicUsize,
    last: Mutex<Option<String>>,
}

impl ExportHealth {
    fn failed(&self, why: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.last.lock() {
            *last = Some(why);
        }
    }
}

impl Exporter {
    /// Flushes and stops; the warning to print when spans were lost.
    fn finish(self) -> Option<String> {
        let Exporter {
            provider,
            endpoint,
            health,
        } = self;
        let stopped = provider.shutdown();
        let failures = health.failures.load(Ordering::Relaxed);
        if failures > 0 {
            let last = health
                .last
                .lock()
                .ok()
                .and_then(|l| l.clone())
                .unwrap_or_default();
            return Some(format!(
                "{failures} trace export request(s) to {endpoint} failed, so the trace is incomplete (last: {last}); is the collector up?"
            ));
        }
        stopped.err().map(|error| {
            format!(
                "the last spans were not exported ({error}); is the collector at {endpoint} up?"
            )
        })
    }
}

impl Telemetry {
    /// Whether spans are exported.
    #[cfg(test)]
    pub(crate) fn exporting(&self) -> bool {
        self.exporter.is_some()
    }

    /// Exports what is buffered and stops the exporter (a no-op without one).
    pub(crate) fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(warning) = self.exporter.take().and_then(Exporter::finish) {
            eprintln!("protobot: warning: {warning}");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Only spans, never events, and only protobot's own (not the client libraries').
fn export_filter<S>() -> impl tracing_subscriber::layer::Filter<S> {
    tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_span()
            && meta.target().starts_with("protobot")
            && *meta.level() <= tracing::Level::INFO
    })
}

/// The exporter and its tracer provider for `config` (the batch exporter's thread starts here).
fn provider(config: &OtlpConfig) -> Result<Exporter, String> {
    let health = Arc::new(ExportHealth::default());
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(config.endpoint.clone())
        .with_timeout(config.timeout)
        .with_http_client(ExportClient::new(config.timeout, Arc::clone(&health)))
        .build()
        .map_err(|e| e.to_string())?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder_empty()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    Ok(Exporter {
        provider,
        endpoint: config.endpoint.clone(),
        health,
    })
}

/// The export decision for this process: the provider, or `None` with a warning already
/// decided (returned for the caller to print the way its output goes).
fn decide(var: impl Fn(&str) -> Option<String>) -> (Option<Exporter>, Option<String>) {
    match OtlpConfig::from_env(var) {
        Ok(None) => (None, None),
        Ok(Some(config)) => match provider(&config) {
            Ok(p) => (Some(p), None),
            Err(e) => (
                None,
                Some(format!(
                    "unable to start the OTLP trace exporter for {}: {e}; running without trace export",
                    config.endpoint
                )),
            ),
        },
        Err(e) => (None, Some(format!("{e}; running without trace export"))),
    }
}

/// The subscriber of a long-running service: JSON logs filtered by `RUST_LOG` or `log`, and the
/// OTLP export when configured. A configuration it cannot honour is logged as a warning.
pub(crate) fn init_service(log: &str) -> Telemetry {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(log))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (exporter, warning) = decide(|name| std::env::var(name).ok());
    let otel = exporter.as_ref().map(|e| {
        tracing_opentelemetry::layer()
            .with_tracer(e.provider.tracer("protobot"))
            .with_filter(export_filter())
    });
    let installed = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().json().with_filter(filter))
        .with(otel)
        .try_init();
    if let Some(warning) = warning {
        tracing::warn!("{warning}");
    }
    if installed.is_ok() && exporter.is_some() {
        tracing::info!("exporting spans over OTLP/HTTP (OTEL_EXPORTER_OTLP_*)");
    }
    Telemetry { exporter }
}

/// The subscriber of a single-machine command (`demo`, `eval`, `run`, `retry`): `capture` (the
/// egress decisions the result records use) and the OTLP export when configured; no log output,
/// as before. A configuration it cannot honour is a warning on stderr.
pub(crate) fn init_command<L>(capture: L) -> Telemetry
where
    L: Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    let (exporter, warning) = decide(|name| std::env::var(name).ok());
    if let Some(warning) = warning {
        eprintln!("protobot: warning: {warning}");
    }
    let otel = exporter.as_ref().map(|e| {
        tracing_opentelemetry::layer()
            .with_tracer(e.provider.tracer("protobot"))
            .with_filter(export_filter())
    });
    if let Err(error) = tracing_subscriber::registry()
        .with(capture)
        .with(otel)
        .try_init()
    {
        eprintln!("protobot: warning: tracing not set up ({error})");
    }
    Telemetry { exporter }
}

/// The largest collector answer read (an OTLP answer is a few bytes).
const MAX_ANSWER: usize = 64 * 1024;

/// The exporter's HTTP/1 client: hyper-util's (already in the tree for kube, with the same
/// features) on a current-thread runtime of its own, made on first use in the batch exporter's
/// thread. The SDK's batch processor calls it from a plain thread, where the process's runtime
/// may be shutting down or busy; its own runtime keeps the last export at exit independent of
/// both.
#[derive(Debug)]
struct ExportClient {
    timeout: Duration,
    health: Arc<ExportHealth>,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<Bytes>,
    >,
    runtime: OnceLock<Result<tokio::runtime::Runtime, String>>,
}

impl ExportClient {
    fn new(timeout: Duration, health: Arc<ExportHealth>) -> Self {
        Self {
            timeout,
            health,
            client: hyper_util::client::legacy::Client::builder(
                hyper_util::rt::TokioExecutor::new(),
            )
            .build_http(),
            runtime: OnceLock::new(),
        }
    }

    async fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        use http_body_util::BodyExt;
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, http_body_util::Full::new(body));
        let exchange = async {
            let (parts, body) = self.client.request(request).await?.into_parts();
            let body = http_body_util::Limited::new(body, MAX_ANSWER)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("the collector did not answer within {:?}", self.timeout))?
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err("the OTLP export client was called on an async runtime thread".into());
        }
        let runtime = self.runtime.get_or_init(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("failed to start the exporter's runtime: {e}"))
        });
        let answer = match runtime {
            Ok(runtime) => runtime.block_on(self.send(request)),
            Err(e) => Err(e.clone().into()),
        };
        match &answer {
            Err(e) => self.health.failed(e.to_string()),
            Ok(r) if !r.status().is_success() => self
                .health
                .failed(format!("the collector answered {}", r.status())),
            Ok(_) => {}
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<Option<OtlpConfig>, OtlpConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        OtlpConfig::from_env(|name| vars.get(name).cloned())
    }

    #[test]
    fn no_variable_means_no_export() {
        assert_eq!(config(&[]), Ok(None));
        // Only a service name or a protocol does not turn export on.
        assert_eq!(
            config(&[
                ("OTEL_SERVICE_NAME", "x"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            ]),
            Ok(None)
        );
        // Empty values count as unset.
        assert_eq!(config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]), Ok(None));
    }

    #[test]
    fn no_variable_installs_no_exporter() {
        // Nothing set: no provider (so no exporter thread) and nothing to warn about.
        let (exporter, warning) = decide(|_| None);
        assert!(exporter.is_none());
        let telemetry = Telemetry { exporter };
        assert!(!telemetry.exporting());
        assert!(warning.is_none());
        telemetry.shutdown();
    }

    #[test]
    fn the_generic_endpoint_gets_the_traces_path() {
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/"),
            ("OTEL_SERVICE_NAME", "protobot-demo"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(c.service_name, "protobot-demo");
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn the_traces_endpoint_wins_and_is_used_as_given() {
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://wrong:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://collector:4318/custom",
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://collector:4318/custom");
        assert_eq!(c.service_name, DEFAULT_SERVICE_NAME);
        assert_eq!(c.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn disabling_variables_turn_export_off() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert_eq!(config(&[on, ("OTEL_SDK_DISABLED", "true")]), Ok(None));
        assert_eq!(config(&[on, ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
    }

    #[test]
    fn what_cannot_be_honoured_says_what_to_set() {
        let err = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318")]).unwrap_err();
        assert_eq!(
            err,
            OtlpConfigError::Endpoint {
                var: "OTEL_EXPORTER_OTLP_ENDPOINT",
                value: "127.0.0.1:4318".into()
            }
        );
        assert!(err.to_string().contains("http://127.0.0.1:4318"));
        assert!(matches!(
            config(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://c:4318/v1/traces"
            )]),
            Err(OtlpConfigError::Endpoint { .. })
        ));
        let err = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("set it to http/protobuf"), "{err}");
        // The signal's protocol variable is read first.
        assert!(matches!(
            config(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ]),
            Err(OtlpConfigError::Protocol {
                var: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                ..
            })
        ));
        assert!(matches!(
            config(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ]),
            Err(OtlpConfigError::Timeout { .. })
        ));
    }

    #[test]
    fn a_bad_variable_is_a_warning_and_no_exporter() {
        let (exporter, warning) = decide(|name| {
            (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "localhost:4318".to_owned())
        });
        assert!(exporter.is_none());
        let warning = warning.unwrap();
        assert!(warning.contains("not an http:// URL"), "{warning}");
        assert!(
            warning.ends_with("running without trace export"),
            "{warning}"
        );
    }

    #[test]
    fn an_unreachable_collector_is_a_warning_at_exit_not_a_failure() {
        // Port 9 (discard) on loopback: nothing listens. The export fails in the exporter's
        // thread; the flush at exit says so and names the endpoint.
        let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")])
            .unwrap()
            .unwrap();
        let exporter = provider(&c).unwrap();
        {
            use opentelemetry::trace::Tracer as _;
            let _span = exporter.provider.tracer("test").start("unexported");
        }
        let warning = exporter.finish().unwrap();
        // The exporter retries a failed batch: one or more requests, each counted.
        assert!(
            warning.contains("trace export request(s) to http://127.0.0.1:9/v1/traces failed")
                && warning.ends_with("is the collector up?"),
            "{warning}"
        );
    }
}
