//! Capacity and back-pressure: whether a run's pod has room on a node, and what a
//! project's queue of ready items is waiting for. Pure: the caller reads Nodes, Pods,
//! its build slots and its work items and hands the figures in as typed values; nothing
//! here reads a clock, a cluster or a file.
//!
//! - [`node_room`]: does any Ready, schedulable node have the run pod's CPU and memory
//!   requests free (allocatable minus what its pods request)? A replica claims only when
//!   one has ([`Room::Fits`]); otherwise it says why ([`Starved`]).
//! - [`queue`]: how many of a project's ready items wait beyond what can be claimed now,
//!   and the first reason they wait (no free build slot, the WIP limit, no node room, runs
//!   refused). Dispatch order is unchanged ([`crate::dispatch::plan`]): the queue is the
//!   ready items in that order past the ones a dispatch can claim.

use std::fmt;

use serde::{Deserialize, Serialize};

/// CPU and memory: what a pod requests or a node has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// Millicores.
    pub cpu_millis: u64,
    /// Bytes.
    pub memory_bytes: u64,
}

impl Resources {
    /// `self - other`, each figure at least 0.
    pub fn saturating_sub(self, other: Resources) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.saturating_sub(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_sub(other.memory_bytes),
        }
    }

    /// `self + other`, each figure at most `u64::MAX`.
    pub fn saturating_add(self, other: Resources) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
        }
    }

    /// Whether `need` fits in `self` (both figures).
    pub fn holds(self, need: Resources) -> bool {
        self.cpu_millis >= need.cpu_millis && self.memory_bytes >= need.memory_bytes
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpu {}m, memory {}Mi",
            self.cpu_millis,
            self.memory_bytes >> 20
        )
    }
}

/// What the back-pressure check knows of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// Not cordoned (`spec.unschedulable` unset) and no `NoSchedule`/`NoExecute` taint.
    pub schedulable: bool,
    /// `status.allocatable`.
    pub allocatable: Resources,
    /// The sum of the requests of the pods bound to it that have not finished.
    pub requested: Resources,
}

impl NodeView {
    /// What is left on the node for a new pod.
    pub fn free(&self) -> Resources {
        self.allocatable.saturating_sub(self.requested)
    }
}

/// Whether a run's pod has room now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Room {
    /// It fits on `node` (the Ready, schedulable node with the most free CPU).
    Fits {
        /// The roomiest node.
        node: String,
        /// What that node has free.
        free: Resources,
    },
    /// It fits nowhere.
    Starved(Starved),
}

impl Room {
    /// Whether a replica may claim.
    pub fn fits(&self) -> bool {
        matches!(self, Room::Fits { .. })
    }
}

/// Why a run's pod fits on no node: each message says what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Starved {
    /// No Node object is visible.
    #[error(
        "no node is visible to the operator; add nodes, or turn the node-room check off (jobSite.nodeRoomCheck.enabled=false) on a cluster whose nodes it may not list"
    )]
    NoNodes,
    /// Nodes exist but none is Ready and schedulable.
    #[error(
        "none of the {nodes} node(s) is Ready and schedulable; uncordon a node or fix its kubelet"
    )]
    NoReadyNode {
        /// How many nodes there are.
        nodes: usize,
    },
    /// Every Ready, schedulable node has less free than the pod requests.
    #[error(
        "no Ready node has room for a run's pod (it requests {need}); the roomiest, {node}, has {free} free: wait for running pods to finish, add nodes, or lower the sandbox profile's cpuRequest or the run memory limit"
    )]
    NoRoom {
        /// What the run's pod requests.
        need: Resources,
        /// The node with the most free CPU.
        node: String,
        /// What it has free.
        free: Resources,
    },
}

/// Whether a pod requesting `pod` fits on one of `nodes` (pure).
pub fn node_room(nodes: &[NodeView], pod: Resources) -> Room {
    if nodes.is_empty() {
        return Room::Starved(Starved::NoNodes);
    }
    // Roomiest first: most free CPU, then most free memory, then name (a total order).
    let mut usable: Vec<&NodeView> = nodes.iter().filter(|n| n.ready && n.schedulable).collect();
    usable.sort_by(|a, b| {
        let (fa, fb) = (a.free(), b.free());
        fb.cpu_millis
            .cmp(&fa.cpu_millis)
            .then(fb.memory_bytes.cmp(&fa.memory_bytes))
            .then(a.name.cmp(&b.name))
    });
    if usable.is_empty() {
        return Room::Starved(Starved::NoReadyNode { nodes: nodes.len() });
    }
    match usable.iter().find(|n| n.free().holds(pod)) {
        Some(n) => Room::Fits {
            node: n.name.clone(),
            free: n.free(),
        },
        None => {
            let roomiest = usable[0];
            Room::Starved(Starved::NoRoom {
                need: pod,
                node: roomiest.name.clone(),
                free: roomiest.free(),
            })
        }
    }
}

/// Whether this replica's runs are admitted at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Runs may start (the sandbox profile is conformant and a node has room, or the
    /// node-room check is off).
    Admitted,
    /// No node has room for a run's pod.
    NodeStarved(Starved),
    /// The executor refuses runs for another reason (its profile's conformance report).
    Refused(String),
}

/// What a project's queue is computed from: one project, one replica, one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueInput {
    /// The project's items in `ready-for-building` (none of them claimed).
    pub ready: usize,
    /// The project's items building, inspecting or merging under a live lease (any
    /// replica's): they count against the WIP limit.
    pub active: usize,
    /// The project's WIP limit (`spec.wipLimit`).
    pub wip_limit: usize,
    /// This replica's free build slots (shared by every project).
    pub free_slots: usize,
    /// Whether runs are admitted.
    pub admission: Admission,
}

/// Why the head of a project's queue waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum QueueReason {
    /// Nothing is ready.
    Empty,
    /// Every ready item can be claimed now (the next dispatch claims them).
    Claimable,
    /// Every build slot of the replica is taken.
    NoFreeSlot,
    /// The project's WIP limit is reached.
    WipLimit,
    /// No node has room for a run's pod.
    NodeStarved,
    /// The executor refuses runs (the sandbox profile's conformance report).
    RunsRefused,
}

impl QueueReason {
    /// The reason as written on `Project` status and Events (CamelCase, stable).
    pub fn as_str(self) -> &'static str {
        match self {
            QueueReason::Empty => "Empty",
            QueueReason::Claimable => "Claimable",
            QueueReason::NoFreeSlot => "NoFreeSlot",
            QueueReason::WipLimit => "WipLimit",
            QueueReason::NodeStarved => "NodeStarved",
            QueueReason::RunsRefused => "RunsRefused",
        }
    }

    /// Whether the wait is a fault an operator should act on (a Warning Event), not the
    /// ordinary back-pressure of a busy replica.
    pub fn is_warning(self) -> bool {
        matches!(self, QueueReason::NodeStarved | QueueReason::RunsRefused)
    }
}

/// A project's queue as one replica sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queue {
    /// Items in `ready-for-building`.
    pub ready: usize,
    /// Ready items beyond what can be claimed now: they wait for a slot, the WIP limit or
    /// node room.
    pub queued: usize,
    /// Why the first of them waits.
    pub reason: QueueReason,
    /// A sentence for status and Events.
    pub message: String,
}

/// The queue of one project (pure). Ready items that a dispatch can claim now (within the
/// free slots and the WIP limit's room, when runs are admitted) are not queued; the rest
/// are, with the first reason that holds them: runs refused, no node room, the WIP limit,
/// no free slot.
pub fn queue(input: &QueueInput) -> Queue {
    let QueueInput {
        ready,
        active,
        wip_limit,
        free_slots,
        admission,
    } = input;
    let (ready, active, free_slots) = (*ready, *active, *free_slots);
    let wip_limit = (*wip_limit).max(1);
    let wip_room = wip_limit.saturating_sub(active);
    let done = |queued: usize, reason: QueueReason, message: String| Queue {
        ready,
        queued,
        reason,
        message,
    };
    if ready == 0 {
        return done(
            0,
            QueueReason::Empty,
            "no item is ready for building".into(),
        );
    }
    match admission {
        Admission::Refused(why) => {
            return done(
                ready,
                QueueReason::RunsRefused,
                format!("{ready} ready item(s) wait: the executor refuses runs ({why})"),
            );
        }
        Admission::NodeStarved(why) => {
            return done(
                ready,
                QueueReason::NodeStarved,
                format!("{ready} ready item(s) wait: {why}"),
            );
        }
        Admission::Admitted => {}
    }
    let claimable = ready.min(wip_room).min(free_slots);
    let queued = ready - claimable;
    if queued == 0 {
        return done(
            0,
            QueueReason::Claimable,
            format!("{ready} ready item(s), all claimable now"),
        );
    }
    // The tighter bound names the reason; the WIP limit wins a tie (raising slots would
    // not help).
    if wip_room <= free_slots {
        done(
            queued,
            QueueReason::WipLimit,
            format!(
                "{queued} of {ready} ready item(s) wait: {active} active of the WIP limit {wip_limit}"
            ),
        )
    } else {
        done(
            queued,
            QueueReason::NoFreeSlot,
            format!(
                "{queued} of {ready} ready item(s) wait for a build slot ({free_slots} free on this replica)"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn node(
        name: &str,
        ready: bool,
        cpu: u64,
        mem_gi: u64,
        used_cpu: u64,
        used_gi: u64,
    ) -> NodeView {
        NodeView {
            name: name.into(),
            ready,
            schedulable: true,
            allocatable: Resources {
                cpu_millis: cpu,
                memory_bytes: mem_gi * GI,
            },
            requested: Resources {
                cpu_millis: used_cpu,
                memory_bytes: used_gi * GI,
            },
        }
    }

    fn pod(cpu: u64, mem_gi: u64) -> Resources {
        Resources {
            cpu_millis: cpu,
            memory_bytes: mem_gi * GI,
        }
    }

    #[test]
    fn a_pod_fits_on_the_roomiest_ready_node() {
        let nodes = [
            node("a", true, 2000, 8, 1800, 1),
            node("b", true, 2000, 8, 500, 1),
            node("c", false, 8000, 64, 0, 0),
        ];
        assert_eq!(
            node_room(&nodes, pod(250, 2)),
            Room::Fits {
                node: "b".into(),
                free: pod(1500, 7)
            }
        );
    }

    #[test]
    fn a_node_with_cpu_but_no_memory_is_no_room() {
        let nodes = [node("a", true, 4000, 4, 0, 3)];
        let room = node_room(&nodes, pod(250, 2));
        assert!(!room.fits());
        let Room::Starved(starved @ Starved::NoRoom { .. }) = room else {
            panic!("{room:?}")
        };
        assert_eq!(
            starved,
            Starved::NoRoom {
                need: pod(250, 2),
                node: "a".into(),
                free: pod(4000, 1)
            }
        );
        assert!(
            starved
                .to_string()
                .contains("lower the sandbox profile's cpuRequest")
        );
    }

    #[test]
    fn overcommitted_nodes_count_as_full_not_as_an_overflow() {
        // Requests above allocatable (static pods, a shrunk node) leave zero, not a wrap.
        let nodes = [node("a", true, 2000, 8, 2600, 9)];
        assert_eq!(
            node_room(&nodes, pod(1, 0)),
            Room::Starved(Starved::NoRoom {
                need: pod(1, 0),
                node: "a".into(),
                free: pod(0, 0)
            })
        );
        assert!(
            node_room(&nodes, pod(0, 0)).fits(),
            "a pod requesting nothing always fits"
        );
    }

    #[test]
    fn no_nodes_and_no_ready_nodes_are_told_apart() {
        assert_eq!(node_room(&[], pod(250, 1)), Room::Starved(Starved::NoNodes));
        let mut cordoned = node("a", true, 2000, 8, 0, 0);
        cordoned.schedulable = false;
        let nodes = [cordoned, node("b", false, 2000, 8, 0, 0)];
        assert_eq!(
            node_room(&nodes, pod(250, 1)),
            Room::Starved(Starved::NoReadyNode { nodes: 2 })
        );
    }

    #[test]
    fn the_exact_remainder_fits() {
        let nodes = [node("a", true, 2000, 4, 1750, 2)];
        assert!(node_room(&nodes, pod(250, 2)).fits());
        assert!(!node_room(&nodes, pod(251, 2)).fits());
    }

    fn input(ready: usize, active: usize, wip: usize, free: usize) -> QueueInput {
        QueueInput {
            ready,
            active,
            wip_limit: wip,
            free_slots: free,
            admission: Admission::Admitted,
        }
    }

    #[test]
    fn ready_items_past_the_free_slots_queue_for_a_slot() {
        let q = queue(&input(1000, 2, 256, 0));
        assert_eq!(
            (q.ready, q.queued, q.reason),
            (1000, 1000, QueueReason::NoFreeSlot)
        );
        let q = queue(&input(1000, 2, 256, 6));
        assert_eq!((q.queued, q.reason), (994, QueueReason::NoFreeSlot));
        assert_eq!(
            q.message,
            "994 of 1000 ready item(s) wait for a build slot (6 free on this replica)"
        );
    }

    #[test]
    fn the_wip_limit_names_the_wait_when_it_is_the_tighter_bound() {
        let q = queue(&input(10, 4, 4, 8));
        assert_eq!((q.queued, q.reason), (10, QueueReason::WipLimit));
        let q = queue(&input(10, 1, 4, 8));
        assert_eq!((q.queued, q.reason), (7, QueueReason::WipLimit));
        // A tie: raising the slots would not help, so the WIP limit is named.
        let q = queue(&input(10, 1, 4, 3));
        assert_eq!((q.queued, q.reason), (7, QueueReason::WipLimit));
        // More active than the limit (a lowered limit) queues everything, without underflow.
        let q = queue(&input(3, 9, 4, 8));
        assert_eq!((q.queued, q.reason), (3, QueueReason::WipLimit));
    }

    #[test]
    fn nothing_queues_when_every_ready_item_is_claimable_or_nothing_is_ready() {
        let q = queue(&input(3, 0, 4, 8));
        assert_eq!((q.queued, q.reason), (0, QueueReason::Claimable));
        let q = queue(&input(0, 4, 4, 0));
        assert_eq!((q.ready, q.queued, q.reason), (0, 0, QueueReason::Empty));
        // A zero WIP limit (never valid on a Project) is read as 1.
        let q = queue(&input(2, 0, 0, 8));
        assert_eq!((q.queued, q.reason), (1, QueueReason::WipLimit));
    }

    #[test]
    fn a_starved_node_or_refused_runs_queue_every_ready_item_and_say_why() {
        let mut i = input(5, 0, 4, 8);
        i.admission = Admission::NodeStarved(Starved::NoNodes);
        let q = queue(&i);
        assert_eq!((q.queued, q.reason), (5, QueueReason::NodeStarved));
        assert!(q.message.contains("no node is visible"), "{}", q.message);
        assert!(q.reason.is_warning());
        i.admission = Admission::Refused("sandbox profile kata is not conformant".into());
        let q = queue(&i);
        assert_eq!((q.queued, q.reason), (5, QueueReason::RunsRefused));
        assert!(q.reason.is_warning());
        assert!(
            !QueueReason::NoFreeSlot.is_warning(),
            "a busy replica is no fault"
        );
        // Nothing ready: nothing waits, whatever the admission.
        i.ready = 0;
        assert_eq!(queue(&i).reason, QueueReason::Empty);
    }
}
