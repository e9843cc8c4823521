"""The kube-scheduler model (docs/placement.md "The scheduler model"): filters, scores, ties."""

from __future__ import annotations

import random

import pytest

from kratos_admit.domain import vocabulary as v
from kratos_admit.simulation.scheduling import (
    ClusterState,
    PodRequest,
    least_allocated_score,
    node_affinity_scores,
    schedule,
    term_matches,
)
from tests.builders import A100, L4, L40S, T4, sim_node


def product_in(*products: str, weight: int = 0) -> dict[str, object]:
    expression = {"key": v.GPU_PRODUCT_LABEL, "operator": "In", "values": list(products)}
    return (
        {"weight": weight, "preference": {"matchExpressions": [expression]}}
        if weight
        else {"matchExpressions": [expression]}
    )


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        pytest.param({"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]}, True, id="gt"),
        pytest.param({"key": "nvidia.com/gpu.memory", "operator": "Lt", "values": ["40000"]}, False, id="lt"),
        pytest.param({"key": v.GPU_PRODUCT_LABEL, "operator": "NotIn", "values": [A100]}, False, id="notin"),
        pytest.param({"key": "absent", "operator": "DoesNotExist"}, True, id="does-not-exist"),
        pytest.param({"key": "absent", "operator": "Exists"}, False, id="exists"),
        pytest.param({"key": "absent", "operator": "NotIn", "values": ["x"]}, True, id="notin-absent-key"),
    ],
)
def test_node_selector_operators_match_as_the_api_defines_them(expression, matches):
    labels = {v.GPU_PRODUCT_LABEL: A100, "nvidia.com/gpu.memory": "81920"}
    assert term_matches({"matchExpressions": [expression]}, labels) is matches


def test_an_empty_term_matches_no_node():
    assert term_matches({}, {v.GPU_PRODUCT_LABEL: A100}) is False


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        pytest.param({A100: 100, L40S: 31}, [100, 31, 0], id="best-gets-100"),
        pytest.param({A100: 40, L40S: 20}, [100, 50, 0], id="normalised-to-the-best"),
        pytest.param({}, [0, 0, 0], id="no-preference-all-zero"),
    ],
)
def test_node_affinity_scores_are_normalised_so_the_best_node_gets_100(weights, expected):
    nodes = [sim_node("a", A100), sim_node("b", L40S), sim_node("c", T4)]
    pod = PodRequest(gpus=1, preferred_terms=tuple(product_in(p, weight=w) for p, w in weights.items()))
    assert node_affinity_scores(pod, nodes) == expected


def test_least_allocated_prefers_the_emptier_node_counting_non_zero_default_requests():
    busy, idle = sim_node("busy", L4, cpu=4, memory_gib=4), sim_node("idle", L4, cpu=4, memory_gib=4)
    state = ClusterState((busy, idle))
    for _ in range(3):
        state.bind(busy, PodRequest(gpus=1))  # no requests: 100m CPU and 200 MB each, as the scorer counts
    pod = PodRequest(gpus=1)
    assert least_allocated_score(busy, pod, state) < least_allocated_score(idle, pod, state)
    # (4000-400)/4000 and (4 GiB - 800 MB)/4 GiB, each x100, averaged
    assert least_allocated_score(busy, pod, state) == (90 + 81) // 2


def test_the_preferred_product_wins_over_a_less_allocated_node():
    a100, t4 = sim_node("a100", A100, cpu=8), sim_node("t4", T4, cpu=96)
    state = ClusterState((a100, t4))
    pod = PodRequest(gpus=1, preferred_terms=(product_in(A100, weight=100), product_in(T4, weight=10)))
    assert schedule(pod, state, random.Random(1)) == a100


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(PodRequest(gpus=8), None, id="more-gpus-than-free-waits"),
        pytest.param(
            PodRequest(gpus=1, required_terms=(product_in(L40S),)), None, id="required-product-absent"
        ),
        pytest.param(PodRequest(gpus=4), "t4", id="fits-the-node-with-room"),
    ],
)
def test_a_pod_binds_only_where_it_fits(pod, expected):
    a100, t4 = sim_node("a100", A100, gpus=8), sim_node("t4", T4, gpus=4)
    state = ClusterState((a100, t4))
    state.bind(a100, PodRequest(gpus=6))
    found = schedule(pod, state, random.Random(1))
    assert (found.name if found else None) == expected


def test_ties_are_broken_at_random_with_the_seed_deciding():
    nodes = tuple(sim_node(f"n{i}", L4) for i in range(6))
    picks = [schedule(PodRequest(gpus=1), ClusterState(nodes), random.Random(seed)) for seed in range(30)]
    names = {node.name for node in picks if node is not None}
    assert len(names) > 1, "equal nodes are chosen among at random, not always the first"
    first = schedule(PodRequest(gpus=1), ClusterState(nodes), random.Random(7))
    again = schedule(PodRequest(gpus=1), ClusterState(nodes), random.Random(7))
    assert first == again


def test_a_pod_spec_is_read_for_gpus_requests_and_affinity():
    spec = {
        "containers": [
            {
                "name": "a",
                "resources": {
                    "limits": {"nvidia.com/gpu": "2"},
                    "requests": {"cpu": "1500m", "memory": "2Gi"},
                },
            }
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [product_in(A100)]},
                "preferredDuringSchedulingIgnoredDuringExecution": [product_in(A100, weight=100)],
            }
        },
    }
    pod = PodRequest.from_pod_spec(spec)
    assert (pod.gpus, pod.milli_cpu, pod.memory_bytes) == (2, 1500, 2 * 2**30)
    assert len(pod.required_terms) == 1 and pod.preferred_terms[0]["weight"] == 100


def twelve_memory_bound_pods(scheduler_name: str) -> list[PodRequest]:
    """The e2e case of issue 26: memory-bound Pods with CPU and memory requests, hinted A100 100,
    L40S 52, L4 17 (what the ranking gives a memory-bound profile)."""
    terms = (product_in(A100, weight=100), product_in(L40S, weight=52), product_in(L4, weight=17))
    return [
        PodRequest(
            gpus=1,
            milli_cpu=4000,
            memory_bytes=32 * 2**30,
            preferred_terms=terms,
            scheduler_name=scheduler_name,
        )
        for _ in range(12)
    ]


def place_all(pods: list[PodRequest], seed: int) -> tuple[list[str], list[int]]:
    """Each Pod bound in turn, as kube-scheduler's queue takes them; the product each went to, and
    the A100 node's free GPUs at each binding."""
    a100 = sim_node("a100", A100, gpus=8, cpu=32, memory_gib=256)  # a small host: its CPU fills up
    l40s = sim_node("l40s", L40S, gpus=4, cpu=192, memory_gib=1536)
    l4 = sim_node("l4", L4, gpus=1, cpu=16, memory_gib=64)
    state, rng = ClusterState((a100, l40s, l4)), random.Random(seed)
    products, a100_free = [], []
    for pod in pods:
        node = schedule(pod, state, rng)
        assert node is not None
        a100_free.append(state.free_gpus(a100))
        state.bind(node, pod)
        products.append(node.product)
    return products, a100_free


@pytest.mark.parametrize("seed", range(5))
def test_under_the_kratos_scheduler_profile_twelve_memory_bound_pods_go_eight_four_zero(seed):
    """The scheduler-affinity component's profile (NodeAffinity 50): the A100 fills first, to its
    last GPU, then the L40S; never the L4."""
    products, _ = place_all(twelve_memory_bound_pods(v.KRATOS_SCHEDULER_NAME), seed)
    assert products == [A100] * 8 + [L40S] * 4


def test_under_the_default_profile_the_a100s_last_gpu_loses_to_least_allocated():
    """The default profile (NodeAffinity 2): at the A100 node's last free GPU its CPU is all but
    requested, and LeastAllocated (about 97 for the empty L40S host, 0 for the A100's) outweighs
    the affinity gap (2 x (100 - 52) = 96): the eighth Pod goes to the L40S with an A100 free, the
    7/5 moment the real control plane showed."""
    products, a100_free = place_all(twelve_memory_bound_pods(""), seed=0)
    assert products[:8] == [A100] * 7 + [L40S] and a100_free[7] == 1
    assert products.count(L4) == 0
