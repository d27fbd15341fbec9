//! The Kubernetes WorkStore: the WMS lives in the cluster, sharded over the
//! project's `BuildWorkItem` statuses and a few labelled ConfigMaps (see
//! [`shard`]). Every call is: fetch the shards it touches by name → join them
//! into a (partial) state → run the backend-independent adapter on it → split
//! the result → write only the shards that moved, each with a
//! `resourceVersion` precondition (or a create that fails on
//! `AlreadyExists`), the home work item's status last. Which shards a call
//! touches is learnt by running it ([`partial`]): a run that touched a shard
//! not yet fetched is discarded, the shard is fetched and the run repeated, so
//! a command costs a few GETs whatever the size of the project. Calls that
//! enumerate list only what they read (`list`: the work items; `findings`:
//! the finding ConfigMaps), never the key claims, which accumulate one per
//! command; the audit trail lists the whole project. Any
//! write conflict re-runs the whole call against fresh objects, so the
//! evaluator always decides on what it reads, and the idempotency key turns a
//! retried call into a replay rather than a second mutation. Fencing tokens
//! come from a counter object that only grows, so they stay unique across
//! operator restarts.
//!
//! Items are `BuildWorkItem` objects named from their ids; ids that are not
//! valid object names are mapped with a digest suffix. Other shards are
//! ConfigMaps named from a digest of the project and the shard id.

pub mod partial;
pub mod shard;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams, PostParams},
};
use partial::{Need, Partial, unmet_dependencies};
use protobot_api::{BuildWorkItem, BuildWorkItemSpec, BusinessPriority, ChangeType, LocalRef};
use protobot_lifecycle::{
    ApprovalRecord, AuditEvent, AuthorizationContext, OperationEnvelope, ResultEnvelope,
    Submission, WorkItemRecord,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use shard::{Kind, ShardId};

use crate::{
    AdapterConfig, FindingRecord, Import, ItemFilter, Observation, RequestRecord, StoreError,
    WorkStore, adapter, memory::WmsState, txn::WmsTxn,
};

/// Label naming the project an object belongs to.
pub const PROJECT_LABEL: &str = "protobot.dev/wms-project";
/// Label naming the shard kind of a ConfigMap.
pub const KIND_LABEL: &str = "protobot.dev/wms-kind";
/// How many times a call is re-run after write conflicts before giving up.
pub const MAX_ATTEMPTS: usize = 64;

/// A WorkStore backed by the Kubernetes API.
#[derive(Clone)]
pub struct KubeStore {
    client: Client,
    namespace: String,
    project: String,
    cfg: AdapterConfig,
    /// A watch cache of BuildWorkItems that [`WorkStore::list`] reads instead of the API
    /// once it has synced ([`KubeStore::with_item_cache`]).
    item_cache: Option<kube::runtime::reflector::Store<BuildWorkItem>>,
}

/// One loaded object: its name, version and (for items) the full object.
#[derive(Clone, Debug)]
struct Loaded {
    name: String,
    resource_version: Option<String>,
    object: Option<BuildWorkItem>,
}

/// The shards a call has read so far.
#[derive(Default)]
struct Snapshot {
    /// Values of the shards that exist.
    shards: BTreeMap<ShardId, Value>,
    /// Their objects (an item may exist before its first status write).
    objects: BTreeMap<ShardId, Loaded>,
    /// Shards fetched, whether they exist or not.
    known: BTreeSet<ShardId>,
    /// Whether the snapshot is the whole project (every other shard is absent).
    everything: bool,
}

impl Snapshot {
    fn knows(&self, id: &ShardId) -> bool {
        self.everything || self.known.contains(id)
    }
}

enum WriteError {
    /// A `resourceVersion` precondition or a create lost to another writer: re-run.
    Conflict,
    /// Anything else: the call fails with it.
    Failed(StoreError),
}

fn digest(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// The object name of a work item: the id when it is a valid DNS-1123 name,
/// else a sanitized prefix plus a digest of the id.
pub fn item_name(id: &str) -> String {
    let valid = !id.is_empty()
        && id.len() <= 200
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        return id.to_string();
    }
    let mut prefix: String = id
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    prefix = prefix.trim_matches('-').to_string();
    let hash = &digest(id)[..12];
    if prefix.is_empty() {
        format!("wi-{hash}")
    } else {
        format!("{prefix}-{hash}")
    }
}

/// A WMS config map's shard id, value and object (`None`: not a WMS shard).
fn decode_config_map(cm: ConfigMap) -> Result<Option<(ShardId, Value, Loaded)>, StoreError> {
    let labels = cm.metadata.labels.clone().unwrap_or_default();
    let Some(kind) = labels.get(KIND_LABEL).and_then(|k| Kind::parse(k)) else {
        return Ok(None);
    };
    let data = cm.data.clone().unwrap_or_default();
    let (Some(id), Some(value)) = (data.get("id"), data.get("value")) else {
        return Ok(None);
    };
    let value: Value = serde_json::from_str(value).map_err(|e| {
        StoreError::undecodable(
            format!(
                "the value of config map {}",
                cm.metadata.name.as_deref().unwrap_or("(unnamed)")
            ),
            e,
        )
    })?;
    let loaded = Loaded {
        name: cm.metadata.name.clone().unwrap_or_default(),
        resource_version: cm.metadata.resource_version.clone(),
        object: None,
    };
    Ok(Some(((kind, id.clone()), value, loaded)))
}

/// A work item object's id, ledger (`None` before its first status write) and object.
///
/// Read raw, not as a typed `BuildWorkItem`: the spec must decode (it is immutable and
/// written once by the store), but the mirrored status fields of an object written by an
/// older version may not, and must not make the project unreadable. The ledger is read on
/// its own; an undecodable mirror is dropped here and rebuilt from the record on the next
/// write ([`status::PreviousStatus`], docs/crd-versioning.md).
fn decode_item(raw: DynamicObject) -> Result<(String, Option<Value>, Loaded), StoreError> {
    let name = raw.metadata.name.clone().unwrap_or_default();
    let spec: BuildWorkItemSpec =
        serde_json::from_value(raw.data.get("spec").cloned().unwrap_or(Value::Null))
            .map_err(|e| StoreError::undecodable(format!("the spec of BuildWorkItem {name}"), e))?;
    let id = spec.work_item_id.clone();
    let raw_status = raw.data.get("status");
    // An item created but never given its ledger (a crash between the create
    // and the status write) holds nothing yet.
    let value = match status::raw_ledger(raw_status) {
        Some(ledger) => Some(
            serde_json::from_str(ledger)
                .map_err(|e| StoreError::undecodable(ledger_record(&name, &id), e))?,
        ),
        None => None,
    };
    // A mirror this version cannot decode is rebuilt from the ledger by the next write.
    let previous = status::PreviousStatus::decode(raw_status).typed();
    let mut object = BuildWorkItem::new(&name, spec);
    object.metadata = raw.metadata;
    object.status = previous;
    let loaded = Loaded {
        name,
        resource_version: object.metadata.resource_version.clone(),
        object: Some(object),
    };
    Ok((id, value, loaded))
}

/// Which record a work item's ledger is, for [`StoreError::Undecodable`].
fn ledger_record(name: &str, id: &str) -> String {
    if name == id {
        format!("the ledger of BuildWorkItem {name}")
    } else {
        format!("the ledger of BuildWorkItem {name} (work item {id:?})")
    }
}

fn kube_error(what: &str, e: kube::Error) -> WriteError {
    match &e {
        kube::Error::Api(s) if s.code == 409 => WriteError::Conflict,
        _ => WriteError::Failed(StoreError::backend(what, e)),
    }
}

/// A failure to encode what the store is about to write (never expected: the values
/// come from the store's own serialization).
fn encode_error(what: String, e: serde_json::Error) -> WriteError {
    WriteError::Failed(StoreError::backend(what, e))
}

impl KubeStore {
    /// A store for `project` in `namespace`. The BuildWorkItem CRD must be installed.
    pub fn new(client: Client, namespace: &str, project: &str, cfg: AdapterConfig) -> KubeStore {
        KubeStore {
            client,
            namespace: namespace.to_string(),
            project: project.to_string(),
            cfg,
            item_cache: None,
        }
    }

    /// Serves [`WorkStore::list`] from `cache` (a reflector's store of BuildWorkItems that
    /// watches this namespace, the operator's own) once it has synced: a dispatch then
    /// costs no list call, and skips the ledgers of items in states it did not ask for,
    /// so a project's finished history costs it next to nothing. The cache may lag the
    /// API by a moment; every write still goes through the API guarded by the object's
    /// resourceVersion, so a stale read costs a refused command, never a lost or doubled
    /// one. Every other read goes to the API.
    pub fn with_item_cache(
        mut self,
        cache: kube::runtime::reflector::Store<BuildWorkItem>,
    ) -> KubeStore {
        self.item_cache = Some(cache);
        self
    }

    /// The records of the cached items of this project that `filter` may match; `None`
    /// when there is no cache or it has not synced yet.
    fn cached_records(
        &self,
        filter: &ItemFilter,
    ) -> Option<Result<Vec<WorkItemRecord>, StoreError>> {
        use futures::FutureExt;
        let cache = self.item_cache.as_ref()?;
        cache.wait_until_ready().now_or_never()?.ok()?;
        let label = label_value(&self.project);
        let wanted: Vec<protobot_api::LifecycleState> = filter
            .states
            .iter()
            .filter_map(|s| status::lifecycle_state(*s))
            .collect();
        let mut shards = BTreeMap::new();
        for item in cache.state() {
            if item.metadata.namespace.as_deref() != Some(self.namespace.as_str())
                || item
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(PROJECT_LABEL))
                    != Some(&label)
            {
                continue;
            }
            let Some(status) = item.status.as_ref() else {
                continue;
            };
            // The mirrored state tells which ledgers to read; the filter below decides.
            if !filter.states.is_empty() && !wanted.contains(&status.state) {
                continue;
            }
            let Some(ledger) = status.ledger.as_deref() else {
                continue;
            };
            let id = item.spec.work_item_id.clone();
            match serde_json::from_str::<Value>(ledger) {
                Ok(value) => {
                    shards.insert((Kind::Item, id), value);
                }
                Err(e) => {
                    let name = item.metadata.name.as_deref().unwrap_or_default();
                    return Some(Err(StoreError::undecodable(ledger_record(name, &id), e)));
                }
            }
        }
        Some(self.join(&shards).map(|state| {
            state
                .records
                .into_values()
                .filter(|r| filter.matches(r))
                .collect()
        }))
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn item_api(&self) -> Api<BuildWorkItem> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The work items as raw objects, for reads ([`decode_item`]); writes go through
    /// [`Self::item_api`].
    fn raw_item_api(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &ApiResource::erase::<BuildWorkItem>(&()),
        )
    }

    fn selector(&self) -> String {
        format!("{PROJECT_LABEL}={}", label_value(&self.project))
    }

    fn config_map_name(&self, kind: Kind, id: &str) -> String {
        format!(
            "pbw-{}-{}",
            kind.as_str(),
            &digest(&format!("{}\n{id}", self.project))[..24]
        )
    }

    /// Joins loaded shards; a shard that does not decode is named by its object.
    fn join(&self, shards: &BTreeMap<ShardId, Value>) -> Result<WmsState, StoreError> {
        shard::join(&self.project, shards).map_err(|e| {
            let record = match e.kind {
                Kind::Item => ledger_record(&item_name(&e.id), &e.id),
                kind => format!(
                    "the {} shard {:?} in config map {}",
                    kind.as_str(),
                    e.id,
                    self.config_map_name(kind, &e.id)
                ),
            };
            StoreError::undecodable(record, e.source)
        })
    }

    /// Lists the whole project (for calls that enumerate).
    async fn load_everything(&self) -> Result<Snapshot, StoreError> {
        let mut snapshot = self.load(Some(None), true).await?;
        snapshot.everything = true;
        Ok(snapshot)
    }

    /// Lists part of the project for a read that needs no more: the ConfigMaps of one kind
    /// (`Some(Some(kind))`), all of them (`Some(None)`) or none (`None`), and the work items
    /// when `items`. Key claims (one per command, kept forever) are only listed when a call
    /// needs everything, so enumerating work items costs what the items cost.
    async fn load(&self, maps: Option<Option<Kind>>, items: bool) -> Result<Snapshot, StoreError> {
        let unavailable =
            |what: &str, e: kube::Error| StoreError::backend(format!("list {what}"), e);
        let mut snapshot = Snapshot::default();
        if let Some(kind) = maps {
            let selector = match kind {
                Some(kind) => format!("{},{KIND_LABEL}={}", self.selector(), kind.as_str()),
                None => self.selector(),
            };
            let maps = self
                .config_maps()
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| unavailable("WMS config maps", e))?;
            for cm in maps.items {
                if let Some((id, value, loaded)) = decode_config_map(cm)? {
                    snapshot.known.insert(id.clone());
                    snapshot.shards.insert(id.clone(), value);
                    snapshot.objects.insert(id, loaded);
                }
            }
        }
        if items {
            let items = self
                .raw_item_api()
                .list(&ListParams::default().labels(&self.selector()))
                .await
                .map_err(|e| unavailable("build work items", e))?;
            for item in items.items {
                let (id, value, loaded) = decode_item(item)?;
                let shard = (Kind::Item, id);
                snapshot.known.insert(shard.clone());
                if let Some(value) = value {
                    snapshot.shards.insert(shard.clone(), value);
                }
                snapshot.objects.insert(shard, loaded);
            }
        }
        Ok(snapshot)
    }

    /// Fetches `wanted` (and what their joins depend on) into `snapshot`.
    async fn fetch(
        &self,
        snapshot: &mut Snapshot,
        wanted: BTreeSet<ShardId>,
    ) -> Result<(), StoreError> {
        let mut wanted: BTreeSet<ShardId> = wanted
            .into_iter()
            .filter(|id| !snapshot.knows(id))
            .collect();
        while !wanted.is_empty() {
            let fetched =
                futures::future::try_join_all(wanted.iter().map(|id| self.fetch_one(id))).await?;
            let mut arrived = BTreeMap::new();
            for (id, found) in wanted.into_iter().zip(fetched) {
                snapshot.known.insert(id.clone());
                if let Some((value, loaded)) = found {
                    if let Some(value) = value {
                        arrived.insert(id.clone(), value.clone());
                        snapshot.shards.insert(id.clone(), value);
                    }
                    snapshot.objects.insert(id, loaded);
                }
            }
            wanted = unmet_dependencies(&arrived, &snapshot.known);
        }
        Ok(())
    }

    /// One shard by name: `None` when its object does not exist.
    async fn fetch_one(&self, id: &ShardId) -> Result<Option<(Option<Value>, Loaded)>, StoreError> {
        let (kind, wms_id) = id;
        let unavailable =
            |what: String, e: kube::Error| StoreError::backend(format!("read {what}"), e);
        if *kind == Kind::Item {
            let name = item_name(wms_id);
            let Some(object) = self
                .raw_item_api()
                .get_opt(&name)
                .await
                .map_err(|e| unavailable(format!("work item {wms_id}"), e))?
            else {
                return Ok(None);
            };
            let (found, value, loaded) = decode_item(object)?;
            if &found != wms_id {
                return Err(StoreError::Foreign {
                    object: format!("BuildWorkItem {name}"),
                    conflict: format!("holds work item {found:?}, not {wms_id:?}"),
                    remedy: "an object of that name was created by something other than the work store: rename or delete it",
                });
            }
            return Ok(Some((value, loaded)));
        }
        let name = self.config_map_name(*kind, wms_id);
        let Some(cm) = self
            .config_maps()
            .get_opt(&name)
            .await
            .map_err(|e| unavailable(format!("config map {name}"), e))?
        else {
            return Ok(None);
        };
        match decode_config_map(cm)? {
            Some((found, value, loaded)) if &found == id => Ok(Some((Some(value), loaded))),
            _ => Err(StoreError::Foreign {
                object: format!("config map {name}"),
                conflict: format!("does not hold the {} shard {wms_id:?}", kind.as_str()),
                remedy: "it was changed by something other than the work store: delete it only if the project is being rebuilt",
            }),
        }
    }

    /// Runs `f` on the shards it touches and writes what it changed; re-runs
    /// on conflicts. `f` is deterministic: it may run several times while the
    /// shards it touches are fetched, and only its last run counts.
    async fn transact<T>(
        &self,
        now: Option<Timestamp>,
        f: impl Fn(&mut dyn WmsTxn) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.transact_mode(now, crate::trace::Mode::Apply, f).await
    }

    /// [`KubeStore::transact`]; with [`crate::trace::Mode::DryRun`] the call
    /// reads what it needs and returns before writing anything.
    async fn transact_mode<T>(
        &self,
        now: Option<Timestamp>,
        mode: crate::trace::Mode,
        f: impl Fn(&mut dyn WmsTxn) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut hint: BTreeSet<ShardId> = BTreeSet::new();
        let mut everything = false;
        for _ in 0..MAX_ATTEMPTS {
            let mut snapshot = if everything {
                self.load_everything().await?
            } else {
                let mut s = Snapshot::default();
                self.fetch(&mut s, hint.clone()).await?;
                s
            };
            let mut reread: BTreeSet<ShardId> = BTreeSet::new();
            let (out, after) = loop {
                self.reread_stale_claims(&mut snapshot, &mut reread).await?;
                let state = self.join(&snapshot.shards)?;
                let mut view = Partial::new(state, &snapshot.known, snapshot.everything);
                let out = f(&mut view);
                let (state, need) = view.finish();
                match need {
                    Need::Nothing => break (out?, state),
                    Need::Shards(more) => self.fetch(&mut snapshot, more).await?,
                    Need::Everything => {
                        everything = true;
                        snapshot = self.load_everything().await?;
                    }
                }
            };
            if mode == crate::trace::Mode::DryRun {
                return Ok(out);
            }
            let mut shards = shard::split(&after, &snapshot.shards);
            // Results archived out of an item move into their claims, which
            // must be read before they are rewritten.
            loop {
                let unread: BTreeSet<ShardId> = shard::archive_targets(&shards)
                    .into_iter()
                    .filter(|id| !snapshot.knows(id))
                    .collect();
                if unread.is_empty() {
                    break;
                }
                self.fetch(&mut snapshot, unread).await?;
                shards = shard::split(&after, &snapshot.shards);
            }
            match self.commit(&snapshot, &shards, now).await {
                Ok(()) => return Ok(out),
                Err(WriteError::Conflict) => {
                    hint = snapshot.known;
                    tokio::task::yield_now().await
                }
                Err(WriteError::Failed(err)) => return Err(err),
            }
        }
        Err(StoreError::Contention {
            attempts: MAX_ATTEMPTS,
        })
    }

    /// Reads again, once per call, each claim that was read just before its
    /// result was archived out of an item read just after
    /// ([`shard::stale_claims`]).
    async fn reread_stale_claims(
        &self,
        snapshot: &mut Snapshot,
        reread: &mut BTreeSet<ShardId>,
    ) -> Result<(), StoreError> {
        let stale: BTreeSet<ShardId> = shard::stale_claims(&snapshot.shards)
            .into_iter()
            .filter(|id| !reread.contains(id))
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        let everything = snapshot.everything;
        snapshot.everything = false;
        for id in &stale {
            snapshot.shards.remove(id);
            snapshot.objects.remove(id);
            snapshot.known.remove(id);
            reread.insert(id.clone());
        }
        let fetched = self.fetch(snapshot, stale).await;
        snapshot.everything = everything;
        fetched
    }

    async fn commit(
        &self,
        before: &Snapshot,
        after: &BTreeMap<ShardId, Value>,
        now: Option<Timestamp>,
    ) -> Result<(), WriteError> {
        // Shard kinds order the writes: counters and claims first, items last.
        // Only shards the call knows: a split of a partial state also yields
        // claims of keys homed in a loaded item, which were not read.
        let mut changed: Vec<(&ShardId, &Value)> = after
            .iter()
            .filter(|(id, v)| before.knows(id) && before.shards.get(*id) != Some(*v))
            .collect();
        changed.sort_by_key(|((kind, id), _)| (*kind, id.clone()));
        for ((kind, id), value) in changed {
            if *kind == Kind::Item {
                self.write_item(
                    id,
                    value,
                    before.objects.get(&(Kind::Item, id.clone())),
                    now,
                )
                .await?;
            } else {
                self.write_config_map(*kind, id, value, before.objects.get(&(*kind, id.clone())))
                    .await?;
            }
        }
        Ok(())
    }

    async fn write_config_map(
        &self,
        kind: Kind,
        id: &str,
        value: &Value,
        loaded: Option<&Loaded>,
    ) -> Result<(), WriteError> {
        let name = loaded
            .map(|l| l.name.clone())
            .unwrap_or_else(|| self.config_map_name(kind, id));
        let body = serde_json::to_string(value)
            .map_err(|e| encode_error(format!("encode config map {name}"), e))?;
        let cm: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "resourceVersion": loaded.and_then(|l| l.resource_version.clone()),
                "labels": {
                    PROJECT_LABEL: label_value(&self.project),
                    KIND_LABEL: kind.as_str(),
                    "app.kubernetes.io/managed-by": "protobot",
                },
            },
            "data": {"id": id, "value": body},
        }))
        .map_err(|e| encode_error(format!("build config map {name}"), e))?;
        let api = self.config_maps();
        let pp = PostParams {
            field_manager: Some("protobot-work-store".into()),
            ..PostParams::default()
        };
        match loaded {
            None => api
                .create(&pp, &cm)
                .await
                .map(|_| ())
                .map_err(|e| kube_error(&format!("create {name}"), e)),
            Some(_) => api
                .replace(&name, &pp, &cm)
                .await
                .map(|_| ())
                .map_err(|e| kube_error(&format!("replace {name}"), e)),
        }
    }

    async fn write_item(
        &self,
        id: &str,
        value: &Value,
        loaded: Option<&Loaded>,
        now: Option<Timestamp>,
    ) -> Result<(), WriteError> {
        let item: shard::ItemShard = serde_json::from_value(value.clone())
            .map_err(|e| encode_error(format!("encode the ledger of {id}"), e))?;
        let Some(record) = item.record.as_ref() else {
            return Ok(());
        };
        let api = self.item_api();
        let pp = PostParams {
            field_manager: Some("protobot-work-store".into()),
            ..PostParams::default()
        };
        let mut object = match loaded.and_then(|l| l.object.clone()) {
            Some(o) => o,
            None => api
                .create(&pp, &self.new_item(record))
                .await
                .map_err(|e| kube_error(&format!("create work item {id}"), e))?,
        };
        let ledger = serde_json::to_string(value)
            .map_err(|e| encode_error(format!("encode the ledger of {id}"), e))?;
        let clock = status::StatusClock {
            now,
            lease_seconds: if self.cfg.lease_seconds > 0 {
                self.cfg.lease_seconds
            } else {
                900
            },
        };
        let written = status::item_status(
            record,
            &item,
            object.status.as_ref(),
            ledger,
            object.metadata.generation,
            clock,
        )
        .map_err(|e| {
            WriteError::Failed(StoreError::undecodable(
                format!("the record of work item {id:?}"),
                e,
            ))
        })?;
        object.status = Some(written);
        let name = object
            .metadata
            .name
            .clone()
            .unwrap_or_else(|| item_name(id));
        api.replace_status(&name, &pp, &object)
            .await
            .map(|_| ())
            .map_err(|e| kube_error(&format!("write the status of work item {id}"), e))
    }

    fn new_item(&self, record: &WorkItemRecord) -> BuildWorkItem {
        let spec = BuildWorkItemSpec {
            work_item_id: record.id.clone(),
            project_ref: LocalRef {
                name: self.project.clone(),
            },
            change_set_ref: None,
            change_set_id: None,
            materialization_key: if record.materialization_key.is_empty() {
                record.id.clone()
            } else {
                record.materialization_key.clone()
            },
            change_type: match record.change_type.as_str() {
                "changes" => ChangeType::Changes,
                "contradicts" => ChangeType::Contradicts,
                _ => ChangeType::Undefined,
            },
            implementation_required: record.implementation_required,
            changed_requirements: Vec::new(),
            applicable_requirements: Vec::new(),
            dependencies: record
                .dependencies
                .iter()
                .map(|d| d.id.clone())
                .filter(|d| !d.is_empty())
                .collect(),
            spec_commit: None,
            business_priority: priority(&record.priority),
        };
        let mut obj = BuildWorkItem::new(&item_name(&record.id), spec);
        obj.metadata.namespace = Some(self.namespace.clone());
        obj.metadata.labels = Some(BTreeMap::from([
            (PROJECT_LABEL.to_string(), label_value(&self.project)),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "protobot".to_string(),
            ),
        ]));
        obj
    }
}

fn priority(p: &str) -> Option<BusinessPriority> {
    match p {
        "low" => Some(BusinessPriority::Low),
        "normal" => Some(BusinessPriority::Normal),
        "high" => Some(BusinessPriority::High),
        "urgent" => Some(BusinessPriority::Urgent),
        _ => None,
    }
}

/// A label-safe project value (63 characters, alphanumerics, `-`, `_`, `.`).
/// The label value the store gives a project's objects (under [`PROJECT_LABEL`]).
pub fn label_value(project: &str) -> String {
    let clean: String = project
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    // A label value is at most 63 characters and begins and ends with an alphanumeric.
    let edges_ok = |s: &str| {
        s.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
            && s.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
    };
    if clean.len() <= 63 && clean == project && edges_ok(&clean) {
        clean
    } else {
        let prefix: String = clean
            .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
            .chars()
            .take(40)
            .collect();
        if prefix.is_empty() {
            digest(project)[..16].to_owned()
        } else {
            format!("{prefix}-{}", &digest(project)[..16])
        }
    }
}

impl crate::trace::TracedStore for KubeStore {
    async fn execute_traced(
        &self,
        ctx: Option<&AuthorizationContext>,
        env: &OperationEnvelope,
        now: Timestamp,
        mode: crate::trace::Mode,
    ) -> Result<crate::trace::Traced, StoreError> {
        self.transact_mode(Some(now), mode, |state| {
            Ok(crate::trace::handle(state, &self.cfg, ctx, env, now, mode))
        })
        .await
    }
}

impl WorkStore for KubeStore {
    fn project_id(&self) -> String {
        self.project.clone()
    }

    async fn execute(
        &self,
        ctx: Option<&AuthorizationContext>,
        env: &OperationEnvelope,
        now: Timestamp,
    ) -> Result<ResultEnvelope, StoreError> {
        self.transact(Some(now), |state| {
            Ok(adapter::handle(state, &self.cfg, ctx, env, now))
        })
        .await
    }

    async fn get(&self, id: &str) -> Result<Option<WorkItemRecord>, StoreError> {
        let mut snapshot = Snapshot::default();
        self.fetch(
            &mut snapshot,
            BTreeSet::from([(Kind::Item, id.to_string())]),
        )
        .await?;
        Ok(snapshot
            .shards
            .get(&(Kind::Item, id.to_string()))
            .and_then(|v| serde_json::from_value::<shard::ItemShard>(v.clone()).ok())
            .and_then(|item| item.record))
    }

    async fn list(&self, filter: &ItemFilter) -> Result<Vec<WorkItemRecord>, StoreError> {
        if let Some(cached) = self.cached_records(filter) {
            return cached;
        }
        // Records live in their items' status.
        Ok(self
            .scoped(None, true)
            .await?
            .records
            .into_values()
            .filter(|r| filter.matches(r))
            .collect())
    }

    async fn observe(&self, id: &str, observation: Observation) -> Result<(), StoreError> {
        self.transact(None, |state| {
            crate::observe::apply(state, id, observation.clone())
        })
        .await
    }

    async fn import(&self, import: Import) -> Result<(), StoreError> {
        self.transact(None, |state| {
            crate::import::apply(state, import.clone());
            Ok(())
        })
        .await
    }

    async fn findings(&self, inspection_run_id: &str) -> Result<Vec<FindingRecord>, StoreError> {
        let mut out: Vec<FindingRecord> = self
            .scoped(Some(Some(Kind::Finding)), false)
            .await?
            .findings
            .into_values()
            .filter(|f| f.inspection_run_id == inspection_run_id)
            .collect();
        out.sort_by_key(|f| f.sequence);
        Ok(out)
    }

    async fn audit_events(&self) -> Result<Vec<AuditEvent>, StoreError> {
        Ok(self.state().await?.audit)
    }

    async fn approval(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        Ok(self
            .targeted((Kind::Approval, id.to_string()))
            .await?
            .approvals
            .get(id)
            .cloned())
    }

    async fn submission(&self, id: &str) -> Result<Option<Submission>, StoreError> {
        // Submissions live in their items' ledgers.
        Ok(self.scoped(None, true).await?.submissions.get(id).cloned())
    }

    async fn request(&self, id: &str) -> Result<Option<RequestRecord>, StoreError> {
        Ok(self
            .targeted((Kind::Request, id.to_string()))
            .await?
            .requests
            .get(id)
            .cloned())
    }
}

/// What [`KubeStore::collect_orphaned_claims`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrphanedClaims {
    /// Key claims deleted: their home work item is gone.
    pub deleted: usize,
    /// Key claims whose home item is gone but that are younger than the minimum age.
    pub too_young: usize,
    /// Key claims changed or removed by someone else meanwhile (left for the next sweep).
    pub raced: usize,
}

impl KubeStore {
    /// Deletes the idempotency-key claims whose home work item no longer exists and that
    /// were created at least `min_age` before `now`.
    ///
    /// One key-claim ConfigMap is created per command and the contract never expires keys,
    /// so claims are kept as long as their work item: a finished `BuildWorkItem` deleted by
    /// an administrator takes its ledger and, after this sweep, its claims with it. A retry
    /// of such a command is then evaluated afresh (the item is gone: `NOT_FOUND`).
    ///
    /// Left alone:
    /// - claims with no home item (results of commands that touched no item);
    /// - materialization reservations, which keep a registered change set from being
    ///   materialized twice.
    ///
    /// `min_age` covers a command between writing its claim and creating its item (the
    /// commit point). Each home item is checked by name just before its claims go, and each
    /// delete carries the claim's `resourceVersion`, so a claim rewritten meanwhile stays.
    pub async fn collect_orphaned_claims(
        &self,
        now: Timestamp,
        min_age: std::time::Duration,
    ) -> Result<OrphanedClaims, StoreError> {
        let selector = format!("{},{KIND_LABEL}={}", self.selector(), Kind::Key.as_str());
        let claims = self
            .config_maps()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| StoreError::backend("list key claims", e))?;
        let min_age = jiff::SignedDuration::try_from(min_age).unwrap_or(jiff::SignedDuration::MAX);
        let mut report = OrphanedClaims::default();
        let mut item_exists: BTreeMap<String, bool> = BTreeMap::new();
        for cm in claims.items {
            let (created, uid) = (
                cm.metadata.creation_timestamp.clone(),
                cm.metadata.uid.clone(),
            );
            let Some(((_, _), value, loaded)) = decode_config_map(cm)? else {
                continue;
            };
            let Ok(claim) = serde_json::from_value::<shard::KeyClaim>(value) else {
                continue;
            };
            let Some(home) = claim.home else { continue };
            let exists = match item_exists.get(&home) {
                Some(exists) => *exists,
                None => {
                    let exists = self
                        .raw_item_api()
                        .get_opt(&item_name(&home))
                        .await
                        .map_err(|e| StoreError::backend(format!("read work item {home}"), e))?
                        .is_some();
                    item_exists.insert(home.clone(), exists);
                    exists
                }
            };
            if exists {
                continue;
            }
            let old_enough =
                created.is_some_and(|created| now.duration_since(created.0) >= min_age);
            if !old_enough {
                report.too_young += 1;
                continue;
            }
            let params = kube::api::DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    resource_version: loaded.resource_version.clone(),
                    uid,
                }),
                ..kube::api::DeleteParams::default()
            };
            match self.config_maps().delete(&loaded.name, &params).await {
                Ok(_) => report.deleted += 1,
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => report.raced += 1,
                Err(e) => {
                    return Err(StoreError::backend(
                        format!("delete key claim {}", loaded.name),
                        e,
                    ));
                }
            }
        }
        Ok(report)
    }
}

impl KubeStore {
    /// The whole project, joined.
    async fn state(&self) -> Result<WmsState, StoreError> {
        let snapshot = self.load_everything().await?;
        self.join(&snapshot.shards)
    }

    /// The state joined from part of the project (see [`Self::load`]).
    async fn scoped(
        &self,
        maps: Option<Option<Kind>>,
        items: bool,
    ) -> Result<WmsState, StoreError> {
        let snapshot = self.load(maps, items).await?;
        self.join(&snapshot.shards)
    }

    /// The state joined from one shard and what its join depends on.
    async fn targeted(&self, id: ShardId) -> Result<WmsState, StoreError> {
        let mut snapshot = Snapshot::default();
        self.fetch(&mut snapshot, BTreeSet::from([id])).await?;
        self.join(&snapshot.shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_names_are_valid_object_names() {
        assert_eq!(item_name("wi-1"), "wi-1");
        let upper = item_name("X");
        assert!(upper.starts_with("x-") && upper.len() == 2 + 12, "{upper}");
        assert_ne!(
            item_name("X"),
            item_name("x"),
            "distinct ids never share a name"
        );
        assert!(item_name("").starts_with("wi-"));
        assert!(item_name(&"a/b".repeat(100)).len() <= 53);
    }

    #[test]
    fn label_values_stay_within_limits() {
        assert_eq!(label_value("fixture-project"), "fixture-project");
        let long = label_value(&"p".repeat(100));
        assert!(long.len() <= 63);
        assert_ne!(label_value("a b"), "a b");
        // Whatever the name, the value is a valid label value: at most 63 characters,
        // alphanumeric at both ends, and distinct names stay distinct.
        let valid = |v: &str| {
            v.len() <= 63
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
                && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
        };
        for name in [
            "-leading",
            "trailing.",
            "_",
            "ü",
            &format!("wi-{}", "x".repeat(250)),
            &format!("{}-", "a".repeat(62)),
        ] {
            let v = label_value(name);
            assert!(valid(&v), "{name:?} -> {v:?}");
        }
        assert_ne!(label_value("-a"), label_value("_a"));
    }
}
