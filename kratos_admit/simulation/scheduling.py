"""A model of where kube-scheduler (v1.28, default profile) binds one pod (docs/placement.md).

Pure. Filter: NodeResourcesFit (the pod's GPUs, CPU and memory fit what is left of the node's
allocatable) and NodeAffinity (``requiredDuringScheduling...`` terms: ORed terms of ANDed
expressions). Score: NodeAffinity (the weights of the matching preferred terms, normalised so the
best node gets 100, ``helper.DefaultNormalizeScore``) at plugin weight 2, plus NodeResourcesFit's
``LeastAllocated`` strategy over CPU and memory (weight 1 each; a container without requests counts
100m CPU and 200 MB, ``schedutil.GetNonzeroRequests``) at plugin weight 1. The highest sum wins;
ties are broken at random as ``selectHost`` does. Plugins that cannot tell these nodes apart
(TaintToleration, PodTopologySpread, InterPodAffinity, ImageLocality) and BalancedAllocation are
left out. A pod whose schedulerName is ``kratos-scheduler`` is scored with that profile's weights
(NodeAffinity 50, webhook-config/components/scheduler-affinity).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kratos_admit.domain.quantity import parse_quantity
from kratos_admit.domain.raw import as_list, as_mapping
from kratos_admit.domain.vocabulary import KRATOS_SCHEDULER_NAME

MAX_NODE_SCORE = 100
# the default profile's plugin weights (pkg/scheduler/apis/config/v1/default_plugins.go, 1.28)
NODE_AFFINITY_WEIGHT = 2
RESOURCES_FIT_WEIGHT = 1
# the profile of webhook-config/components/scheduler-affinity (docs/placement.md "Hints that hold"):
# NodeAffinity at 50, so a gap of 7 points between two products' normalised affinity scores (50 x 7
# = 350) outweighs the most NodeResourcesFit, NodeResourcesBalancedAllocation and ImageLocality can
# add between two nodes (3 x 100 at weight 1 each)
KRATOS_NODE_AFFINITY_WEIGHT = 50


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """A scheduler profile's score plugin weights, as far as the model scores."""

    node_affinity: int = NODE_AFFINITY_WEIGHT
    resources_fit: int = RESOURCES_FIT_WEIGHT


DEFAULT_WEIGHTS = ScoreWeights()
KRATOS_WEIGHTS = ScoreWeights(node_affinity=KRATOS_NODE_AFFINITY_WEIGHT)
DEFAULT_MILLI_CPU_REQUEST = 100  # pkg/scheduler/util/pod_resources.go
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SimNode:
    name: str
    labels: Mapping[str, str]
    gpus: int
    milli_cpu: int
    memory_bytes: int

    @property
    def product(self) -> str:
        return self.labels.get("nvidia.com/gpu.product", "")


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What the scheduler reads from a pod: its GPUs, its requests (0: none stated) and node affinity."""

    gpus: int
    milli_cpu: int = 0
    memory_bytes: int = 0
    required_terms: tuple[Mapping[str, Any], ...] = ()  # nodeSelectorTerms; empty: no requirement
    preferred_terms: tuple[Mapping[str, Any], ...] = ()  # {weight, preference}
    scheduler_name: str = ""  # the pod's schedulerName: which profile scores it

    @classmethod
    def from_pod_spec(cls, pod_spec: Mapping[str, Any]) -> PodRequest:
        gpus = cpu = memory = 0
        for container in as_list(pod_spec.get("containers")):
            resources = as_mapping(as_mapping(container).get("resources"))
            limits, requests = as_mapping(resources.get("limits")), as_mapping(resources.get("requests"))
            gpus += int(str(limits.get("nvidia.com/gpu", requests.get("nvidia.com/gpu", 0))))
            cpu += milli_cpu(requests.get("cpu"))
            memory += quantity_bytes(requests.get("memory"))
        node_affinity = as_mapping(as_mapping(pod_spec.get("affinity")).get("nodeAffinity"))
        required = as_mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
        return cls(
            gpus=gpus,
            milli_cpu=cpu,
            memory_bytes=memory,
            required_terms=tuple(as_mapping(t) for t in as_list(required.get("nodeSelectorTerms"))),
            preferred_terms=tuple(
                as_mapping(t)
                for t in as_list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"))
            ),
            scheduler_name=str(pod_spec.get("schedulerName") or ""),
        )


def milli_cpu(value: object) -> int:
    """A CPU quantity in millicores (0 when absent or not a quantity)."""
    quantity = parse_quantity(value) if value is not None else None
    return int(quantity * 1000) if quantity is not None else 0


def quantity_bytes(value: object) -> int:
    """A memory quantity in bytes (0 when absent or not a quantity)."""
    quantity = parse_quantity(value) if value is not None else None
    return int(quantity) if quantity is not None else 0


@dataclass(slots=True)
class NodeUse:
    """What the pods bound to a node request (their non-zero requests, as the scorer counts them)."""

    gpus: int = 0
    milli_cpu: int = 0
    memory_bytes: int = 0
    pods: int = 0


@dataclass(slots=True)
class ClusterState:
    nodes: tuple[SimNode, ...]
    use: dict[str, NodeUse] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node in self.nodes:
            self.use.setdefault(node.name, NodeUse())

    def free_gpus(self, node: SimNode) -> int:
        return node.gpus - self.use[node.name].gpus

    def bind(self, node: SimNode, pod: PodRequest) -> None:
        use = self.use[node.name]
        use.gpus += pod.gpus
        use.milli_cpu += pod.milli_cpu or DEFAULT_MILLI_CPU_REQUEST
        use.memory_bytes += pod.memory_bytes or DEFAULT_MEMORY_REQUEST
        use.pods += 1

    def release(self, node: SimNode, pod: PodRequest) -> None:
        use = self.use[node.name]
        use.gpus -= pod.gpus
        use.milli_cpu -= pod.milli_cpu or DEFAULT_MILLI_CPU_REQUEST
        use.memory_bytes -= pod.memory_bytes or DEFAULT_MEMORY_REQUEST
        use.pods -= 1


def _expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = str(expression.get("key", "")), expression.get("operator")
    values = [str(x) for x in as_list(expression.get("values"))]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and values:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A NodeSelectorTerm: its matchExpressions ANDed (matchFields, on the node's name, left out);
    an empty term matches nothing, as in ``nodeaffinity.NewNodeSelector``."""
    expressions = [as_mapping(e) for e in as_list(term.get("matchExpressions"))]
    return bool(expressions) and all(_expression_matches(e, labels) for e in expressions)


def feasible(node: SimNode, pod: PodRequest, state: ClusterState) -> bool:
    use = state.use[node.name]
    if node.gpus - use.gpus < pod.gpus:
        return False
    if pod.milli_cpu and node.milli_cpu - use.milli_cpu < pod.milli_cpu:
        return False
    if pod.memory_bytes and node.memory_bytes - use.memory_bytes < pod.memory_bytes:
        return False
    return not pod.required_terms or any(term_matches(t, node.labels) for t in pod.required_terms)


def node_affinity_scores(pod: PodRequest, nodes: Sequence[SimNode]) -> list[int]:
    """The summed weights of each node's matching preferred terms, normalised to 0..100."""
    raw = [
        sum(
            int(term.get("weight", 0))
            for term in pod.preferred_terms
            if term_matches(as_mapping(term.get("preference")), node.labels)
        )
        for node in nodes
    ]
    best = max(raw, default=0)
    return [MAX_NODE_SCORE * s // best for s in raw] if best > 0 else raw


def _least_requested(requested: int, capacity: int) -> int:
    if capacity <= 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def least_allocated_score(node: SimNode, pod: PodRequest, state: ClusterState) -> int:
    use = state.use[node.name]
    cpu = _least_requested(use.milli_cpu + (pod.milli_cpu or DEFAULT_MILLI_CPU_REQUEST), node.milli_cpu)
    memory = _least_requested(
        use.memory_bytes + (pod.memory_bytes or DEFAULT_MEMORY_REQUEST), node.memory_bytes
    )
    return (cpu + memory) // 2


def weights_for(pod: PodRequest) -> ScoreWeights:
    """The profile that scores ``pod``: KRATOS's (``kratos-scheduler``) or the default."""
    return KRATOS_WEIGHTS if pod.scheduler_name == KRATOS_SCHEDULER_NAME else DEFAULT_WEIGHTS


def schedule(
    pod: PodRequest,
    state: ClusterState,
    rng: random.Random,
    *,
    among: Iterable[SimNode] | None = None,
    weights: ScoreWeights | None = None,
) -> SimNode | None:
    """The node kube-scheduler would bind ``pod`` to, or None when no node fits (the pod waits);
    scored with ``weights``, else those of the profile the pod's schedulerName names."""
    candidates = [n for n in (state.nodes if among is None else among) if feasible(n, pod, state)]
    if not candidates:
        return None
    chosen = weights or weights_for(pod)
    affinity = node_affinity_scores(pod, candidates)
    totals = [
        chosen.node_affinity * a + chosen.resources_fit * least_allocated_score(n, pod, state)
        for n, a in zip(candidates, affinity, strict=True)
    ]
    best = max(totals)
    return rng.choice([n for n, t in zip(candidates, totals, strict=True) if t == best])
