//! Published capacity and back-pressure in the cluster: the shell around
//! [`protobot_jobsite::capacity`]'s pure decisions.
//!
//! - **The capacity Lease** ([`publish_capacity`]): each replica keeps a
//!   `coordination.k8s.io/v1` Lease `protobot-capacity-<pod name>` in its own namespace
//!   whose labels carry its build slots (total, in use), its warm sandboxes ready (0:
//!   warm pools do not exist yet) and whether a node has room for a run's pod;
//!   `spec.renewTime` is its liveness. It is applied when a figure changes and renewed at
//!   a third of its duration; deleted when the replica stops. `kubectl get leases -l
//!   protobot.dev/capacity=build-slots -L protobot.dev/slots-total -L
//!   protobot.dev/slots-in-use` reads it (docs/capacity.md).
//! - **The node-room check** ([`watch_node_room`], [`RoomGated`]): with
//!   [`NodeRoomCheck`], the replica reads Nodes and the requests of their unfinished Pods
//!   every few seconds and decides with [`node_room`] whether a run's pod fits; while it
//!   does not, its executor refuses runs ([`ExecutorError::NoRoom`]) and the Job Site
//!   claims nothing (it still recovers and resumes what it holds).
//! - **A project's queue** ([`queue_status`], [`publish_queue`]): after each dispatch the
//!   Job Site computes the project's queue ([`queue`]) and writes it to `status.queue` of
//!   the Project when it changed, with a Warning Event when the wait is a fault.
//!
//! Reads, the decisions' inputs (pure: [`node_views`], [`queue_status`], [`lease_body`])
//! and the writes are apart, so the decisions are tested without a cluster.

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use protobot_api::{Project, ProjectQueue, QueueReason as ApiQueueReason};
use protobot_jobsite::{
    capacity::{Admission, NodeView, Queue, QueueReason, Resources, Room, node_room},
    engine::StopSignal,
    executor::{Executor, ExecutorError, RunOutput, RunSpec},
};
use protobot_kube_executor::profile::{parse_bytes, parse_cpu_millis};

/// Field manager of the capacity Lease and of `Project` `status.queue`.
pub const FIELD_MANAGER: &str = "protobot/jobsite";
/// Label every capacity Lease carries (`protobot.dev/capacity=build-slots`).
pub const CAPACITY_LABEL: &str = "protobot.dev/capacity";
/// Label of the replica's build slots (`--max-concurrent-builds`).
pub const SLOTS_TOTAL_LABEL: &str = "protobot.dev/slots-total";
/// Label of the build slots in use.
pub const SLOTS_IN_USE_LABEL: &str = "protobot.dev/slots-in-use";
/// Label of the warm sandboxes ready to serve a claim (0 until warm pools exist).
pub const WARM_READY_LABEL: &str = "protobot.dev/warm-sandboxes-ready";
/// Label of the node-room verdict: `fits`, `starved`, `unknown` or `off`.
pub const NODE_ROOM_LABEL: &str = "protobot.dev/node-room";
/// Annotation with the node-room verdict in a sentence.
pub const NODE_ROOM_ANNOTATION: &str = "protobot.dev/node-room-detail";
/// Default duration of the capacity Lease: a replica that stops renewing is stale after it.
pub const DEFAULT_LEASE_SECONDS: u32 = 60;
/// How often the figures are compared with what the Lease shows.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// The name of a replica's capacity Lease (a DNS subdomain of at most 253 characters).
pub fn lease_name(identity: &str) -> String {
    let mut name = format!("protobot-capacity-{}", identity.to_ascii_lowercase());
    name.truncate(253);
    name.trim_end_matches(['-', '.']).to_owned()
}

/// Where and how long a replica publishes its capacity Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityLease {
    /// The operator's namespace (`POD_NAMESPACE`).
    pub namespace: String,
    /// `spec.leaseDurationSeconds`: renewed at a third of it.
    pub duration_seconds: u32,
}

impl CapacityLease {
    /// The Lease in `POD_NAMESPACE` (set by the chart from the downward API), lasting
    /// [`DEFAULT_LEASE_SECONDS`]; `None` when the variable is unset (not in a pod: nothing
    /// is published).
    pub fn from_env() -> Option<CapacityLease> {
        std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|ns| !ns.is_empty())
            .map(|namespace| CapacityLease {
                namespace,
                duration_seconds: DEFAULT_LEASE_SECONDS,
            })
    }
}

/// The node-room check: what a run's pod requests, and how often nodes are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRoomCheck {
    /// The requests of a run's pod (the sandbox profile's `cpuRequest` and the run's
    /// memory limit, which is also its request).
    pub pod: Resources,
    /// Time between two reads of Nodes and Pods.
    pub every: Duration,
}

/// The environment variable that turns the node-room check on: `cpu=<quantity>,memory=<quantity>`
/// (the run pod's requests, e.g. `cpu=250m,memory=2Gi`); unset or empty: off.
pub const NODE_ROOM_ENV: &str = "PROTOBOT_NODE_ROOM_CHECK";

/// Why a node-room setting cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeRoomSettingError {
    /// A part is not `cpu=...` or `memory=...`.
    #[error(
        "{NODE_ROOM_ENV}: {part:?} is not cpu=<quantity> or memory=<quantity>; write e.g. cpu=250m,memory=2Gi"
    )]
    Part {
        /// The part.
        part: String,
    },
    /// A quantity does not parse.
    #[error(
        "{NODE_ROOM_ENV}: {key}={value:?} is not a Kubernetes quantity; write e.g. cpu=250m,memory=2Gi"
    )]
    Quantity {
        /// `cpu` or `memory`.
        key: String,
        /// The value.
        value: String,
    },
    /// A figure is missing.
    #[error("{NODE_ROOM_ENV}: {key} is missing; write e.g. cpu=250m,memory=2Gi")]
    Missing {
        /// `cpu` or `memory`.
        key: &'static str,
    },
}

impl NodeRoomCheck {
    /// Parses [`NODE_ROOM_ENV`]'s value (pure); `Ok(None)` for an empty value (off).
    pub fn parse(value: &str) -> Result<Option<NodeRoomCheck>, NodeRoomSettingError> {
        let value = value.trim();
        if value.is_empty() || value == "off" {
            return Ok(None);
        }
        let (mut cpu, mut memory) = (None, None);
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || NodeRoomSettingError::Part { part: part.into() };
            let (key, raw) = part.split_once('=').ok_or_else(bad)?;
            let quantity = |parsed: Option<u64>| {
                parsed.ok_or_else(|| NodeRoomSettingError::Quantity {
                    key: key.into(),
                    value: raw.into(),
                })
            };
            match key.trim() {
                "cpu" => cpu = Some(quantity(parse_cpu_millis(raw.trim()))?),
                "memory" => memory = Some(quantity(parse_bytes(raw.trim()))?),
                _ => return Err(bad()),
            }
        }
        Ok(Some(NodeRoomCheck {
            pod: Resources {
                cpu_millis: cpu.ok_or(NodeRoomSettingError::Missing { key: "cpu" })?,
                memory_bytes: memory.ok_or(NodeRoomSettingError::Missing { key: "memory" })?,
            },
            every: Duration::from_secs(10),
        }))
    }

    /// The check [`NODE_ROOM_ENV`] asks for; a malformed value is logged as an error and
    /// leaves the check off (the message says how to fix it).
    pub fn from_env() -> Option<NodeRoomCheck> {
        let value = std::env::var(NODE_ROOM_ENV).unwrap_or_default();
        match NodeRoomCheck::parse(&value) {
            Ok(check) => check,
            Err(error) => {
                tracing::error!(%error, "the node-room check is off");
                None
            }
        }
    }
}

/// What the node-room check last decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoomState {
    /// The check is off: every claim is admitted (as far as room goes).
    Off,
    /// Not read yet, or the last read failed: claims wait (never on a node not known to
    /// have room).
    Unknown(String),
    /// The last read's verdict.
    Known(Room),
}

impl RoomState {
    /// The label value on the capacity Lease.
    pub fn label(&self) -> &'static str {
        match self {
            RoomState::Off => "off",
            RoomState::Unknown(_) => "unknown",
            RoomState::Known(Room::Fits { .. }) => "fits",
            RoomState::Known(Room::Starved(_)) => "starved",
        }
    }

    /// The verdict in a sentence.
    pub fn detail(&self) -> String {
        match self {
            RoomState::Off => "the node-room check is off".into(),
            RoomState::Unknown(why) => why.clone(),
            RoomState::Known(Room::Fits { node, free }) => {
                format!("a run's pod fits on {node} ({free} free)")
            }
            RoomState::Known(Room::Starved(starved)) => starved.to_string(),
        }
    }

    /// What a claim may do under this verdict: `Some(reason)` refuses it.
    pub fn refusal(&self) -> Option<String> {
        match self {
            RoomState::Off | RoomState::Known(Room::Fits { .. }) => None,
            RoomState::Unknown(why) => Some(why.clone()),
            RoomState::Known(Room::Starved(starved)) => Some(starved.to_string()),
        }
    }
}

/// The replica's node-room verdict, shared by the check, the gate and the publishers.
#[derive(Clone, Debug)]
pub struct RoomView(Arc<RwLock<RoomState>>);

impl RoomView {
    /// A view starting at `state`.
    pub fn new(state: RoomState) -> RoomView {
        RoomView(Arc::new(RwLock::new(state)))
    }

    /// The current verdict.
    pub fn get(&self) -> RoomState {
        self.0
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Replaces the verdict.
    pub fn set(&self, state: RoomState) {
        let mut guard = self.0.write().unwrap_or_else(|e| e.into_inner());
        *guard = state;
    }
}

/// An executor whose runs are admitted only while a node has room ([`RoomView`]); runs
/// themselves are the inner executor's.
pub struct RoomGated<E> {
    inner: Arc<E>,
    room: RoomView,
}

impl<E> RoomGated<E> {
    /// `inner`, gated by `room`.
    pub fn new(inner: Arc<E>, room: RoomView) -> Self {
        RoomGated { inner, room }
    }
}

impl<E: Executor> Executor for RoomGated<E> {
    fn profile(&self) -> &str {
        self.inner.profile()
    }

    fn admit(&self) -> Result<(), ExecutorError> {
        self.inner.admit()?;
        match self.room.get().refusal() {
            None => Ok(()),
            Some(reason) => Err(ExecutorError::NoRoom { reason }),
        }
    }

    fn run(
        &self,
        spec: RunSpec,
        cancel: tokio::sync::watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = Result<RunOutput, ExecutorError>> + Send {
        self.inner.run(spec, cancel)
    }
}

/// Sums a pod's requests as the scheduler counts them: the larger of its containers' sum
/// and its largest init container (pure). Quantities that do not parse count as 0.
fn pod_requests(pod: &Pod) -> Resources {
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let get = |key: &str, parse: fn(&str) -> Option<u64>| {
            requests
                .and_then(|r| r.get(key))
                .and_then(|q| parse(&q.0))
                .unwrap_or(0)
        };
        Resources {
            cpu_millis: get("cpu", parse_cpu_millis),
            memory_bytes: get("memory", parse_bytes),
        }
    };
    let Some(spec) = pod.spec.as_ref() else {
        return Resources::default();
    };
    let containers = spec
        .containers
        .iter()
        .map(of)
        .fold(Resources::default(), Resources::saturating_add);
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(of)
        .fold(Resources::default(), |a, b| Resources {
            cpu_millis: a.cpu_millis.max(b.cpu_millis),
            memory_bytes: a.memory_bytes.max(b.memory_bytes),
        });
    Resources {
        cpu_millis: containers.cpu_millis.max(init.cpu_millis),
        memory_bytes: containers.memory_bytes.max(init.memory_bytes),
    }
}

/// What the node-room check knows of `nodes`, with the requests of the unfinished `pods`
/// bound to each (pure).
pub fn node_views(nodes: &[Node], pods: &[Pod]) -> Vec<NodeView> {
    let mut requested: BTreeMap<&str, Resources> = BTreeMap::new();
    for pod in pods {
        let finished = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        if finished {
            continue;
        }
        let sum = requested.entry(node).or_default();
        *sum = sum.saturating_add(pod_requests(pod));
    }
    nodes
        .iter()
        .map(|node| {
            let name = node.name_any();
            let status = node.status.as_ref();
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let spec = node.spec.as_ref();
            let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
            let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            });
            let allocatable = status.and_then(|s| s.allocatable.as_ref());
            let get = |key: &str, parse: fn(&str) -> Option<u64>| {
                allocatable
                    .and_then(|a| a.get(key))
                    .and_then(|q| parse(&q.0))
                    .unwrap_or(0)
            };
            NodeView {
                requested: requested.get(name.as_str()).copied().unwrap_or_default(),
                name,
                ready,
                schedulable: !cordoned && !tainted,
                allocatable: Resources {
                    cpu_millis: get("cpu", parse_cpu_millis),
                    memory_bytes: get("memory", parse_bytes),
                },
            }
        })
        .collect()
}

/// Reads Nodes and unfinished Pods once and decides whether `pod` fits.
pub async fn read_room(client: &Client, pod: Resources) -> Result<Room, kube::Error> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
        .await?;
    Ok(node_room(&node_views(&nodes.items, &pods.items), pod))
}

/// Keeps `view` current every `check.every` until `stop`: a failed read leaves claims
/// waiting ([`RoomState::Unknown`], logged once per change) rather than claiming blind.
pub async fn watch_node_room(
    client: Client,
    check: NodeRoomCheck,
    view: RoomView,
    stop: StopSignal,
) {
    let mut tick = tokio::time::interval(check.every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.raised() => return,
        }
        let next = match read_room(&client, check.pod).await {
            Ok(room) => RoomState::Known(room),
            Err(error) => RoomState::Unknown(format!(
                "failed to read nodes and pods for the node-room check ({error}); grant the chart's node-room ClusterRole or turn the check off (jobSite.nodeRoomCheck.enabled=false)"
            )),
        };
        let before = view.get();
        if before != next {
            match &next {
                RoomState::Known(Room::Fits { .. }) => {
                    tracing::info!(detail = %next.detail(), "a node has room for a run's pod; claiming")
                }
                _ => {
                    tracing::warn!(detail = %next.detail(), "no room known for a run's pod; claiming nothing")
                }
            }
            view.set(next);
        }
    }
}

/// What a replica's capacity Lease shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityFigures {
    /// `--max-concurrent-builds`.
    pub total: usize,
    /// Build slots taken.
    pub in_use: usize,
    /// Warm sandboxes ready (0: no warm pools yet).
    pub warm_ready: usize,
    /// The node-room verdict.
    pub room: RoomState,
}

/// The capacity Lease's body for server-side apply (pure).
pub fn lease_body(
    identity: &str,
    namespace: &str,
    figures: &CapacityFigures,
    duration_seconds: u32,
    now: Timestamp,
) -> serde_json::Value {
    let micro = now.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(identity),
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/managed-by": "protobot",
                CAPACITY_LABEL: "build-slots",
                SLOTS_TOTAL_LABEL: figures.total.to_string(),
                SLOTS_IN_USE_LABEL: figures.in_use.to_string(),
                WARM_READY_LABEL: figures.warm_ready.to_string(),
                NODE_ROOM_LABEL: figures.room.label(),
            },
            "annotations": {
                NODE_ROOM_ANNOTATION: crate::events::truncate(&figures.room.detail(), 1024),
            },
        },
        "spec": {
            "holderIdentity": identity,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": micro,
        },
    })
}

/// The figures of a replica now.
fn figures(capacity: &tokio::sync::Semaphore, total: usize, room: &RoomView) -> CapacityFigures {
    CapacityFigures {
        total,
        in_use: total.saturating_sub(capacity.available_permits()),
        warm_ready: 0,
        room: room.get(),
    }
}

/// Keeps the replica's capacity Lease current until `stop`, then deletes it. A failed
/// write is logged (the API-error layer names verb and object) and retried at the next
/// check; it never stops the Job Site.
pub async fn publish_capacity(
    client: Client,
    lease: CapacityLease,
    identity: String,
    capacity: Arc<tokio::sync::Semaphore>,
    total: usize,
    room: RoomView,
    stop: StopSignal,
) {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client, &lease.namespace);
    let name = lease_name(&identity);
    let renew_every = Duration::from_secs(u64::from(lease.duration_seconds.max(3)) / 3);
    let mut shown: Option<CapacityFigures> = None;
    let mut renewed_at = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(CHECK_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.raised() => break,
        }
        let now_figures = figures(&capacity, total, &room);
        let due = renewed_at.elapsed() >= renew_every;
        if shown.as_ref() == Some(&now_figures) && !due {
            continue;
        }
        let body = lease_body(
            &identity,
            &lease.namespace,
            &now_figures,
            lease.duration_seconds,
            Timestamp::now(),
        );
        match api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
        {
            Ok(_) => {
                shown = Some(now_figures);
                renewed_at = tokio::time::Instant::now();
            }
            Err(error) => {
                tracing::warn!(lease = %name, namespace = %lease.namespace, %error, "failed to publish this replica's capacity Lease; retrying")
            }
        }
    }
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => tracing::info!(lease = %name, "capacity Lease deleted: this replica stopped"),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(error) => {
            tracing::warn!(lease = %name, %error, "failed to delete the capacity Lease; it goes stale after its duration")
        }
    }
}

/// `status.queue` for `queue` as `identity` saw it at `now` (pure).
pub fn queue_status(queue: &Queue, identity: &str, now: Timestamp) -> ProjectQueue {
    ProjectQueue {
        ready: u32::try_from(queue.ready).unwrap_or(u32::MAX),
        queued: u32::try_from(queue.queued).unwrap_or(u32::MAX),
        reason: api_reason(queue.reason),
        message: crate::events::truncate(&queue.message, 1024),
        reported_by: identity.to_owned(),
        observed_time: Time(now),
    }
}

/// The reason as the CRD spells it.
pub fn api_reason(reason: QueueReason) -> ApiQueueReason {
    match reason {
        QueueReason::Empty => ApiQueueReason::Empty,
        QueueReason::Claimable => ApiQueueReason::Claimable,
        QueueReason::NoFreeSlot => ApiQueueReason::NoFreeSlot,
        QueueReason::WipLimit => ApiQueueReason::WipLimit,
        QueueReason::NodeStarved => ApiQueueReason::NodeStarved,
        QueueReason::RunsRefused => ApiQueueReason::RunsRefused,
    }
}

/// Whether `next` says something `shown` does not (pure): the figures, the reason or the
/// message; who saw it and when do not count, so replicas seeing the same queue do not
/// rewrite it.
pub fn queue_changed(shown: Option<&ProjectQueue>, next: &ProjectQueue) -> bool {
    shown.is_none_or(|s| {
        (s.ready, s.queued, s.reason, &s.message)
            != (next.ready, next.queued, next.reason, &next.message)
    })
}

/// Shortest time between two writes of one project's queue whose reason did not change.
/// Every write of a Project's status wakes every controller watching Projects (the Project
/// controller observes the repository again); a flood changes the figures on every
/// dispatch, so the figures are written at most this often, a new reason at once.
pub const QUEUE_WRITE_EVERY: Duration = Duration::from_secs(5);

/// Whether `next` is written now (pure): it says something new ([`queue_changed`]), and
/// either its reason changed or [`QUEUE_WRITE_EVERY`] passed since this replica last wrote
/// the project's queue (`since_last`; `None`: never).
pub fn queue_write_due(
    shown: Option<&ProjectQueue>,
    next: &ProjectQueue,
    since_last: Option<Duration>,
) -> bool {
    if !queue_changed(shown, next) {
        return false;
    }
    shown.map(|s| s.reason) != Some(next.reason)
        || since_last.is_none_or(|d| d >= QUEUE_WRITE_EVERY)
}

/// The Event a change of queue is reported with (pure): a Warning when the wait becomes a
/// fault (no node room, runs refused); nothing for ordinary back-pressure.
pub fn queue_event(
    shown: Option<&ProjectQueue>,
    next: &ProjectQueue,
    reason: QueueReason,
) -> Option<Event> {
    let was = shown.map(|s| s.reason);
    if !reason.is_warning() || was == Some(next.reason) {
        return None;
    }
    Some(Event {
        type_: EventType::Warning,
        reason: reason.as_str().into(),
        note: Some(next.message.clone()),
        action: "Dispatch".into(),
        secondary: None,
    })
}

/// How a replica's admission reads for a project's queue (pure): a node known to be
/// starved names why; otherwise the (gated) executor's answer, whose refusal covers a
/// node-room verdict not known yet.
pub fn admission(room: &RoomState, executor: Result<(), ExecutorError>) -> Admission {
    if let RoomState::Known(Room::Starved(starved)) = room {
        return Admission::NodeStarved(starved.clone());
    }
    match executor {
        Ok(()) => Admission::Admitted,
        Err(e) => Admission::Refused(e.to_string()),
    }
}

/// Writes `next` to the Project's `status.queue` (server-side apply of that field only)
/// and publishes `event` on the Project; `false` when the status write failed (logged; the
/// next dispatch recomputes the queue and writes it again).
pub async fn publish_queue(
    client: &Client,
    project: &Project,
    identity: &str,
    next: &ProjectQueue,
    event: Option<Event>,
) -> bool {
    let name = project.name_any();
    let ns = project.namespace().unwrap_or_default();
    let api: Api<Project> = Api::namespaced(client.clone(), &ns);
    let body = serde_json::json!({
        "apiVersion": "protobot.dev/v1alpha1",
        "kind": "Project",
        "status": {"queue": next},
    });
    if let Err(error) = api
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        tracing::warn!(project = %name, %error, "failed to write the project's queue on its status; the next dispatch retries");
        return false;
    }
    if let Some(event) = event {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "protobot-jobsite".into(),
                instance: Some(identity.into()),
            },
        );
        if let Err(error) = recorder
            .publish(&crate::events::bounded(&event), &project.object_ref(&()))
            .await
        {
            tracing::warn!(project = %name, %error, "could not publish an event");
        }
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use protobot_jobsite::capacity::Starved;

    use super::*;

    fn node(name: &str, ready: &str, cpu: &str, memory: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory},
                "conditions": [{"type": "Ready", "status": ready}],
            },
        }))
        .unwrap()
    }

    fn pod(node: &str, phase: &str, cpu: &str, memory: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("p-{node}-{cpu}")},
            "spec": {"nodeName": node, "containers": [
                {"name": "a", "resources": {"requests": {"cpu": cpu, "memory": memory}}},
                {"name": "b"},
            ]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn node_views_sum_the_requests_of_unfinished_pods_per_node() {
        let nodes = [
            node("n1", "True", "2", "8Gi"),
            node("n2", "False", "4", "16Gi"),
        ];
        let pods = [
            pod("n1", "Running", "500m", "1Gi"),
            pod("n1", "Pending", "250m", "512Mi"),
            pod("n1", "Succeeded", "1", "4Gi"),
            pod("n2", "Running", "1", "1Gi"),
        ];
        let views = node_views(&nodes, &pods);
        assert_eq!(views[0].name, "n1");
        assert!(views[0].ready && views[0].schedulable);
        assert_eq!(
            views[0].requested,
            Resources {
                cpu_millis: 750,
                memory_bytes: (1 << 30) + (512 << 20)
            }
        );
        assert_eq!(views[0].allocatable.cpu_millis, 2000);
        assert!(!views[1].ready);
        let room = node_room(
            &views,
            Resources {
                cpu_millis: 1250,
                memory_bytes: 2 << 30,
            },
        );
        assert!(room.fits(), "{room:?}");
        let starved = node_room(
            &views,
            Resources {
                cpu_millis: 1251,
                memory_bytes: 0,
            },
        );
        assert!(!starved.fits(), "the not-Ready node's cores do not count");
    }

    #[test]
    fn a_cordoned_or_tainted_node_is_not_schedulable() {
        let mut cordoned = node("c", "True", "8", "8Gi");
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        let mut tainted: Node = node("t", "True", "8", "8Gi");
        tainted.spec = serde_json::from_value(serde_json::json!({
            "taints": [{"key": "k", "effect": "NoSchedule"}],
        }))
        .unwrap();
        let views = node_views(&[cordoned, tainted], &[]);
        assert!(views.iter().all(|v| !v.schedulable));
        assert_eq!(
            node_room(&views, Resources::default()),
            Room::Starved(Starved::NoReadyNode { nodes: 2 })
        );
    }

    #[test]
    fn the_node_room_setting_parses_or_says_how_to_write_it() {
        assert_eq!(NodeRoomCheck::parse(""), Ok(None));
        assert_eq!(NodeRoomCheck::parse("off"), Ok(None));
        let check = NodeRoomCheck::parse("cpu=250m, memory=2Gi")
            .unwrap()
            .unwrap();
        assert_eq!(
            check.pod,
            Resources {
                cpu_millis: 250,
                memory_bytes: 2 << 30
            }
        );
        let err = NodeRoomCheck::parse("cpu=lots,memory=2Gi").unwrap_err();
        assert!(err.to_string().contains("cpu=250m,memory=2Gi"), "{err}");
        assert_eq!(
            NodeRoomCheck::parse("cpu=1"),
            Err(NodeRoomSettingError::Missing { key: "memory" })
        );
        assert!(matches!(
            NodeRoomCheck::parse("gpu=1"),
            Err(NodeRoomSettingError::Part { .. })
        ));
    }

    #[test]
    fn the_lease_carries_the_figures_as_labels_and_renew_time() {
        let figures = CapacityFigures {
            total: 8,
            in_use: 3,
            warm_ready: 0,
            room: RoomState::Known(Room::Starved(Starved::NoNodes)),
        };
        let now: Timestamp = "2026-12-07T04:00:00.123456Z".parse().unwrap();
        let body = lease_body("protobot-7d9f-abc", "protobot-system", &figures, 60, now);
        let labels = &body["metadata"]["labels"];
        assert_eq!(
            body["metadata"]["name"],
            "protobot-capacity-protobot-7d9f-abc"
        );
        assert_eq!(labels[SLOTS_TOTAL_LABEL], "8");
        assert_eq!(labels[SLOTS_IN_USE_LABEL], "3");
        assert_eq!(labels[WARM_READY_LABEL], "0");
        assert_eq!(labels[NODE_ROOM_LABEL], "starved");
        assert_eq!(labels[CAPACITY_LABEL], "build-slots");
        assert_eq!(body["spec"]["renewTime"], "2026-12-07T04:00:00.123456Z");
        assert_eq!(body["spec"]["holderIdentity"], "protobot-7d9f-abc");
        assert!(
            body["metadata"]["annotations"][NODE_ROOM_ANNOTATION]
                .as_str()
                .unwrap()
                .contains("no node is visible")
        );
        // The Lease deserializes as the API's own type.
        let _: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(body).unwrap();
        assert!(lease_name(&"x".repeat(400)).len() <= 253);
    }

    #[test]
    fn the_gate_refuses_while_no_room_is_known_and_admits_when_it_is_off_or_fits() {
        let fits = RoomState::Known(Room::Fits {
            node: "n".into(),
            free: Resources::default(),
        });
        assert_eq!(fits.refusal(), None);
        assert_eq!(RoomState::Off.refusal(), None);
        assert!(
            RoomState::Unknown("not read yet".into())
                .refusal()
                .is_some()
        );
        let starved = RoomState::Known(Room::Starved(Starved::NoNodes));
        assert!(starved.refusal().unwrap().contains("no node is visible"));
        assert_eq!(
            admission(&starved, Ok(())),
            Admission::NodeStarved(Starved::NoNodes)
        );
        assert_eq!(admission(&fits, Ok(())), Admission::Admitted);
        let refused = ExecutorError::ProfileNotConformant {
            profile: "kata".into(),
            reason: "no report".into(),
        };
        assert!(
            matches!(admission(&fits, Err(refused)), Admission::Refused(r) if r.contains("kata"))
        );
    }

    #[test]
    fn a_queue_is_rewritten_only_when_it_says_something_new_and_a_fault_raises_one_warning() {
        use protobot_jobsite::capacity::{QueueInput, queue};
        let now: Timestamp = "2026-12-07T04:00:00Z".parse().unwrap();
        let input = QueueInput {
            ready: 1000,
            active: 2,
            wip_limit: 256,
            free_slots: 0,
            admission: Admission::Admitted,
        };
        let q = queue(&input);
        let first = queue_status(&q, "replica-1", now);
        assert_eq!(
            (first.ready, first.queued, first.reason),
            (1000, 1000, ApiQueueReason::NoFreeSlot)
        );
        assert!(queue_changed(None, &first));
        let same_elsewhere =
            queue_status(&q, "replica-2", now + jiff::SignedDuration::from_secs(5));
        assert!(
            !queue_changed(Some(&first), &same_elsewhere),
            "who and when do not count"
        );
        assert!(
            queue_event(None, &first, q.reason).is_none(),
            "back-pressure is no fault"
        );
        let starved_q = queue(&QueueInput {
            admission: Admission::NodeStarved(Starved::NoNodes),
            ..input.clone()
        });
        let starved = queue_status(&starved_q, "replica-1", now);
        assert!(queue_changed(Some(&first), &starved));
        let event = queue_event(Some(&first), &starved, starved_q.reason).unwrap();
        assert_eq!(
            (event.type_, event.reason.as_str()),
            (EventType::Warning, "NodeStarved")
        );
        assert!(
            queue_event(Some(&starved), &starved, starved_q.reason).is_none(),
            "one Event per transition, not one per dispatch"
        );
        // Writes: a new reason at once; new figures at most every QUEUE_WRITE_EVERY.
        let fewer = queue_status(
            &queue(&QueueInput {
                ready: 999,
                ..input.clone()
            }),
            "replica-1",
            now,
        );
        let soon = Some(Duration::from_secs(1));
        assert!(queue_write_due(None, &first, None));
        assert!(!queue_write_due(Some(&first), &fewer, soon), "throttled");
        assert!(queue_write_due(
            Some(&first),
            &fewer,
            Some(QUEUE_WRITE_EVERY)
        ));
        assert!(queue_write_due(Some(&first), &fewer, None));
        assert!(
            queue_write_due(Some(&first), &starved, soon),
            "a new reason goes at once"
        );
        assert!(
            !queue_write_due(Some(&first), &same_elsewhere, None),
            "nothing new"
        );
    }
}
