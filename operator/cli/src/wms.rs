//! `protobot wms`: one WMS Adapter API request in (a JSON operation envelope
//! or a store read, on stdin or from `--file`), one answer out (JSON on
//! stdout), against a named work store: the SQLite file of a single-machine
//! `protobot run`/`demo` (`--store sqlite:PATH --project ID`) or a cluster
//! Project through the Kubernetes store (`--store kubernetes:NAMESPACE/PROJECT`,
//! KUBECONFIG or in-cluster configuration).
//!
//! The trusted authorization context comes from the caller's configured
//! identity (`--identity FILE`, `--subject`, `--role`, `--action`, `--ref`,
//! `--policy-version`, or their `PROTOBOT_WMS_*` environment variables), never
//! from the request: an envelope has no field that could carry it, and its
//! `untrusted_actor` is ignored. `--dry-run` answers what the rules would
//! decide now and writes nothing.
//!
//! Exit status: 0 for every answer, a rejection included (it is an ordinary
//! envelope with its stable code; a read of a missing object answers
//! `found: false`); 1 when the store failed (`WMS_UNAVAILABLE`: nothing is
//! known to be written; read first, then retry with the same idempotency key,
//! unless the message says a person must act first: a stored record that does
//! not decode, an object the store did not write); 2 for unusable input or configuration (not one JSON object, an envelope with
//! unknown fields, no identity, no such store). Only exit 0 prints on stdout.
//!
//! Pure core: [`Identity::context`] (the trusted context from configuration)
//! and [`StoreSpec::parse`]; the rest is the shell.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::Args;
use jiff::{SignedDuration, Timestamp};
use protobot_controller::wms_api::wire::{self, WmsRequest};
use protobot_lifecycle::{AuthorizationContext, Grant, Role};
use protobot_stores::{AdapterConfig, Mode, SqliteStore, StoreError};
use serde::Deserialize;

/// Arguments of `protobot wms`.
#[derive(Debug, Args)]
pub struct WmsArgs {
    /// The work store: `sqlite:PATH` (a single-machine store, e.g. `<repo>/.git/protobot/wms.sqlite`
    /// or the demo's `<dir>/wms.sqlite`) or `kubernetes:NAMESPACE/PROJECT`.
    #[arg(long, env = "PROTOBOT_WMS_STORE", value_parser = StoreSpec::parse)]
    pub store: StoreSpec,
    /// The project a SQLite store serves (the project id of its spec store). Not used with
    /// `kubernetes:` (the Project's name is the project).
    #[arg(long, env = "PROTOBOT_WMS_PROJECT")]
    pub project: Option<String>,
    /// Read the request from this file instead of stdin.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Your identity as a JSON file: `subject`, `role`, and optionally `allowed_actions`,
    /// `allowed_refs`, `policy_version`, `work_item_id`, `change_set_id`, `expires_at`. Flags
    /// override its fields.
    #[arg(long, env = "PROTOBOT_WMS_IDENTITY")]
    pub identity: Option<PathBuf>,
    /// Your trusted subject (a person's or a component's name; it becomes the lease owner).
    #[arg(long, env = "PROTOBOT_WMS_SUBJECT")]
    pub subject: Option<String>,
    /// The role you act in: human-maintainer, drafting-table, materializer, job-site, reconciler.
    #[arg(long, env = "PROTOBOT_WMS_ROLE")]
    pub role: Option<String>,
    /// An action your context grants (repeatable; default: the requested operation only).
    #[arg(long = "action")]
    pub actions: Vec<String>,
    /// A ref your context grants (repeatable; default: `project:<project>` only).
    #[arg(long = "ref")]
    pub refs: Vec<String>,
    /// The Gate's policy version (default: `protobot-local/v1` for SQLite, the operator's for
    /// Kubernetes).
    #[arg(long, env = "PROTOBOT_WMS_POLICY_VERSION")]
    pub policy_version: Option<String>,
    /// Answer what the rules would decide now; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Evaluate at this RFC 3339 time instead of the system clock (replays and tests; the
    /// operator's HTTP endpoint always uses its own clock).
    #[arg(long)]
    pub now: Option<String>,
    /// The Materializer's trusted subject in this store (blocked-work submissions delegate to
    /// it; default: `materializer` for SQLite, as `protobot run` uses; the operator's for
    /// Kubernetes).
    #[arg(long)]
    pub materializer_subject: Option<String>,
    /// Lease length in seconds a claim issues (default: 900 for SQLite, as `protobot run`
    /// uses; the Project's `leaseDurationSeconds` for Kubernetes).
    #[arg(long)]
    pub lease_seconds: Option<i64>,
}

/// Which work store to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A Project in a cluster.
    Kubernetes {
        /// Its namespace.
        namespace: String,
        /// Its name.
        project: String,
    },
}

impl StoreSpec {
    /// Parses `sqlite:PATH` or `kubernetes:NAMESPACE/PROJECT`.
    pub fn parse(text: &str) -> Result<StoreSpec, String> {
        if let Some(path) = text.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err("sqlite: needs a path, e.g. sqlite:.git/protobot/wms.sqlite".into());
            }
            return Ok(StoreSpec::Sqlite(PathBuf::from(path)));
        }
        if let Some(rest) = text.strip_prefix("kubernetes:") {
            return match rest.split_once('/') {
                Some((ns, project))
                    if !ns.is_empty() && !project.is_empty() && !project.contains('/') =>
                {
                    Ok(StoreSpec::Kubernetes {
                        namespace: ns.into(),
                        project: project.into(),
                    })
                }
                _ => Err("kubernetes: needs NAMESPACE/PROJECT, e.g. kubernetes:team-a/shop".into()),
            };
        }
        Err(format!(
            "`{text}` names no store: use sqlite:PATH or kubernetes:NAMESPACE/PROJECT"
        ))
    }
}

/// The identity file (`--identity`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Identity {
    /// Trusted subject.
    pub subject: String,
    /// Trusted role.
    pub role: String,
    /// Granted actions (empty: the requested operation).
    pub allowed_actions: Vec<String>,
    /// Granted refs (empty: `project:<project>`).
    pub allowed_refs: Vec<String>,
    /// Policy version (empty: the store's default).
    pub policy_version: String,
    /// Optional scoping to one work item.
    pub work_item_id: Option<String>,
    /// Optional scoping to one change set.
    pub change_set_id: Option<String>,
    /// Expiry (default: five minutes after the evaluation time).
    #[serde(default, with = "protobot_lifecycle::strict::timestamp_option")]
    pub expires_at: Option<Timestamp>,
}

/// Why the command could not answer.
#[derive(Debug, thiserror::Error)]
pub enum WmsError {
    /// Input or configuration is unusable (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The request document is unusable (exit 2).
    #[error(transparent)]
    Request(#[from] wire::RequestError),
    /// The store failed (exit 1). Its message says what to do; a transient failure
    /// adds that a read comes first.
    #[error("the work store failed: {0}{hint}", hint = read_first(.0))]
    Store(#[from] StoreError),
}

/// After a transient failure nothing is known to be written: read before retrying. A
/// failure that needs a person says so itself ([`StoreError::is_transient`]).
fn read_first(err: &StoreError) -> &'static str {
    if err.is_transient() {
        "; nothing is known to be written: read first"
    } else {
        ""
    }
}

impl WmsError {
    fn exit_code(&self) -> ExitCode {
        match self {
            WmsError::Store(_) => ExitCode::from(1),
            WmsError::Usage(_) | WmsError::Request(_) => ExitCode::from(2),
        }
    }
}

impl Identity {
    /// The identity from the file (if any) with the flags applied over it.
    fn configured(args: &WmsArgs) -> Result<Identity, WmsError> {
        let mut id = match &args.identity {
            None => Identity::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    WmsError::Usage(format!(
                        "unable to read the identity file {}: {e}",
                        path.display()
                    ))
                })?;
                serde_json::from_str(&text).map_err(|e| {
                    WmsError::Usage(format!(
                        "the identity file {} is invalid: {e}",
                        path.display()
                    ))
                })?
            }
        };
        if let Some(s) = &args.subject {
            id.subject = s.clone();
        }
        if let Some(r) = &args.role {
            id.role = r.clone();
        }
        if !args.actions.is_empty() {
            id.allowed_actions = args.actions.clone();
        }
        if !args.refs.is_empty() {
            id.allowed_refs = args.refs.clone();
        }
        if let Some(p) = &args.policy_version {
            id.policy_version = p.clone();
        }
        Ok(id)
    }

    /// The trusted context for `operation` in `project` at `now`; an empty
    /// policy version takes `default_policy`.
    pub fn context(
        &self,
        project: &str,
        operation: &str,
        default_policy: &str,
        now: Timestamp,
    ) -> Result<AuthorizationContext, WmsError> {
        if self.subject.trim().is_empty() {
            return Err(WmsError::Usage(
                "no identity: pass --subject and --role (or --identity FILE, or PROTOBOT_WMS_SUBJECT and PROTOBOT_WMS_ROLE)".into(),
            ));
        }
        let Some(role) = Role::parse(&self.role) else {
            return Err(WmsError::Usage(format!(
                "role `{}` is not one of human-maintainer, drafting-table, materializer, job-site, reconciler",
                self.role
            )));
        };
        let actions: Vec<&str> = if self.allowed_actions.is_empty() {
            vec![operation]
        } else {
            self.allowed_actions.iter().map(String::as_str).collect()
        };
        // Without a stated expiry, five minutes; at the end of time, none left (fails closed).
        let expires_at = self
            .expires_at
            .or_else(|| now.checked_add(SignedDuration::from_mins(5)).ok())
            .unwrap_or(now);
        let mut context = AuthorizationContext::new(Grant {
            project,
            role,
            subject: &self.subject,
            actions: &actions,
            expires_at,
            policy_version: if self.policy_version.is_empty() {
                default_policy
            } else {
                &self.policy_version
            },
        });
        // An identity that states its refs is granted exactly those (the project's
        // included only if stated), and its scoping as stated.
        if !self.allowed_refs.is_empty() {
            context.allowed_refs = self.allowed_refs.clone();
        }
        context.work_item_id = self.work_item_id.clone();
        context.change_set_id = self.change_set_id.clone();
        Ok(context)
    }
}

/// The policy version of a single-machine store (as `protobot run` uses it).
pub const LOCAL_POLICY_VERSION: &str = "protobot-local/v1";

fn read_input(file: Option<&Path>) -> Result<String, WmsError> {
    let mut text = String::new();
    match file {
        Some(path) => {
            text = std::fs::read_to_string(path).map_err(|e| {
                WmsError::Usage(format!(
                    "unable to read the request {}: {e}",
                    path.display()
                ))
            })?
        }
        None => {
            std::io::stdin().read_to_string(&mut text).map_err(|e| {
                WmsError::Usage(format!("unable to read the request from stdin: {e}"))
            })?;
        }
    }
    Ok(text)
}

async fn run(args: &WmsArgs) -> Result<wire::WmsAnswer, WmsError> {
    let request = WmsRequest::parse(&read_input(args.file.as_deref())?)?;
    let now = match &args.now {
        None => Timestamp::now(),
        Some(t) => protobot_lifecycle::strict::parse_timestamp(t)
            .map_err(|e| WmsError::Usage(format!("--now: {e}")))?,
    };
    let identity = Identity::configured(args)?;
    let mode = if args.dry_run {
        Mode::DryRun
    } else {
        Mode::Apply
    };
    let operation = match &request {
        WmsRequest::Operation(env) => env.operation.clone(),
        WmsRequest::Read(_) => String::new(),
    };
    match &args.store {
        StoreSpec::Sqlite(path) => {
            let project = args.project.as_deref().ok_or_else(|| {
                WmsError::Usage(
                    "a SQLite store needs --project (the project id of its spec store)".into(),
                )
            })?;
            if !path.is_file() {
                return Err(WmsError::Usage(format!(
                    "no such work store {} (a single-machine run keeps it in <repo>/.git/protobot/wms.sqlite)",
                    path.display()
                )));
            }
            let store = SqliteStore::open(
                path,
                project,
                AdapterConfig {
                    materializer_subject: args
                        .materializer_subject
                        .clone()
                        .unwrap_or_else(|| "materializer".into()),
                    lease_seconds: args.lease_seconds.unwrap_or(900),
                },
            )?;
            answer(
                &store,
                &identity,
                project,
                &operation,
                LOCAL_POLICY_VERSION,
                &request,
                now,
                mode,
            )
            .await
        }
        StoreSpec::Kubernetes { namespace, project } => {
            let sink = protobot_controller::api_errors::ApiErrorSink::new();
            let client = protobot_controller::api_errors::infer_client(&sink)
                .await
                .map_err(|e| {
                    WmsError::Usage(format!(
                        "failed to configure the Kubernetes client (KUBECONFIG or in-cluster): {e}"
                    ))
                })?;
            let mut cfg =
                protobot_controller::wms_api::project_adapter_config(&client, namespace, project)
                    .await
                    .map_err(|e| {
                        StoreError::backend(format!("read Project {namespace}/{project}"), e)
                    })?
                    .ok_or_else(|| WmsError::Usage(format!("no Project {namespace}/{project}")))?;
            if let Some(s) = &args.materializer_subject {
                cfg.materializer_subject = s.clone();
            }
            if let Some(l) = args.lease_seconds {
                cfg.lease_seconds = l;
            }
            let store = protobot_stores::KubeStore::new(client, namespace, project, cfg);
            answer(
                &store,
                &identity,
                project,
                &operation,
                protobot_controller::changeset::POLICY_VERSION,
                &request,
                now,
                mode,
            )
            .await
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn answer<S: protobot_stores::TracedStore>(
    store: &S,
    identity: &Identity,
    project: &str,
    operation: &str,
    default_policy: &str,
    request: &WmsRequest,
    now: Timestamp,
    mode: Mode,
) -> Result<wire::WmsAnswer, WmsError> {
    match request {
        WmsRequest::Read(read) => Ok(wire::WmsAnswer::Read(wire::read(store, read).await?)),
        WmsRequest::Operation(env) => {
            let ctx = identity.context(project, operation, default_policy, now)?;
            Ok(wire::WmsAnswer::Operation(
                wire::operate(store, &ctx, env, now, mode).await?,
            ))
        }
    }
}

/// Runs the command.
pub fn wms(args: WmsArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("protobot wms: failed to start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(answer) => match serde_json::to_string_pretty(&answer) {
            Ok(text) => crate::output::print_line(&text),
            Err(e) => {
                eprintln!("protobot wms: failed to encode the answer: {e}");
                ExitCode::from(1)
            }
        },
        Err(e) => {
            eprintln!("protobot wms: {e}");
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_store_is_sqlite_path_or_kubernetes_namespace_and_project() {
        assert_eq!(
            StoreSpec::parse("sqlite:/tmp/w.sqlite"),
            Ok(StoreSpec::Sqlite("/tmp/w.sqlite".into()))
        );
        assert_eq!(
            StoreSpec::parse("kubernetes:team-a/shop"),
            Ok(StoreSpec::Kubernetes {
                namespace: "team-a".into(),
                project: "shop".into()
            })
        );
        for bad in [
            "sqlite:",
            "kubernetes:shop",
            "kubernetes:/shop",
            "kubernetes:a/b/c",
            "/tmp/w.sqlite",
        ] {
            assert!(StoreSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_context_is_the_configured_identity_granting_the_operation_by_default() {
        let now: Timestamp = "2026-09-18T12:00:00Z".parse().unwrap();
        let id = Identity {
            subject: "agent-001".into(),
            role: "drafting-table".into(),
            ..Identity::default()
        };
        let ctx = id.context("p", "request.create", "pv/1", now).unwrap();
        assert_eq!(ctx.allowed_actions, ["request.create"]);
        assert_eq!(ctx.allowed_refs, ["project:p"]);
        assert_eq!(ctx.policy_version, "pv/1");
        assert_eq!(ctx.validate("p", Some(now)), Ok(Role::DraftingTable));
        assert!(matches!(
            Identity::default().context("p", "claim", "pv", now),
            Err(WmsError::Usage(_))
        ));
        let bad_role = Identity {
            role: "root".into(),
            ..id
        };
        assert!(matches!(
            bad_role.context("p", "claim", "pv", now),
            Err(WmsError::Usage(_))
        ));
    }
}
