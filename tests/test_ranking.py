"""The ranking model: application-aware, documented, bounded weights."""

from __future__ import annotations

import pytest

from kratos_admit.ranking import predicted_relative_time, rank_gpu_products
from tests.builders import make_profile
from tests.conftest import CATALOG

A100, L40S = "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"


def order(profile, products=(A100, L40S, "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"), strategy="performance"):
    ranked = rank_gpu_products(profile, products, catalog=CATALOG, strategy=strategy, reference_product=A100)
    return [r.product.product for r in ranked], ranked


def test_memory_bound_profile_ranks_a100_above_l40s():
    products, _ = order(make_profile(sm="12.0", mem="85.0", bound="memory"))
    assert products.index(A100) < products.index(L40S)


def test_compute_bound_profile_ranks_l40s_above_a100():
    products, _ = order(make_profile(sm="90.0", mem="15.0", bound="compute", product=A100))
    assert products.index(L40S) < products.index(A100)


def test_relative_time_by_hand():
    # memory-bound on A100 (2039 GB/s) moved to L40S (864 GB/s): 0.85 * 2039/864 + (1 - 0.85)
    a100, l40s = CATALOG.lookup(A100), CATALOG.lookup(L40S)
    assert a100 and l40s
    assert predicted_relative_time(0.12, 0.85, reference=a100, product=l40s) == pytest.approx(
        0.85 * 2039 / 864 + 0.15
    )
    assert predicted_relative_time(0.12, 0.85, reference=a100, product=a100) == pytest.approx(1.0)


def test_weights_are_between_1_and_100_with_the_best_at_100():
    _, ranked = order(make_profile())
    assert ranked[0].weight == 100
    assert all(1 <= r.weight <= 100 for r in ranked)
    assert [r.weight for r in ranked] == sorted((r.weight for r in ranked), reverse=True)


def test_unknown_products_get_no_preference_and_no_error():
    products, _ = order(make_profile(), products=("NVIDIA-Future-GPU-X", A100))
    assert products == [A100]


def test_shared_and_mig_node_labels_map_to_their_product():
    _, ranked = order(make_profile(), products=(f"{A100}-SHARED", A100, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"))
    labels = {r.product.product: r.labels for r in ranked}
    assert labels[A100] == (A100, f"{A100}-SHARED")
    assert labels["NVIDIA-A100-SXM4-40GB"] == ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",)


def test_without_nodes_the_whole_catalog_is_ranked():
    products, _ = order(make_profile(), products=())
    assert len(products) == len(CATALOG.products)


def test_cost_strategy_prefers_the_cheapest_and_balanced_weighs_both():
    cheap, _ = order(make_profile(), strategy="cost")
    assert cheap[0] == "NVIDIA-L4"
    balanced, _ = order(make_profile(sm="12.0", mem="85.0"), strategy="balanced")
    performance, _ = order(make_profile(sm="12.0", mem="85.0"))
    assert balanced != performance


def test_profile_without_figures_falls_back_to_its_bound_type():
    products, _ = order(make_profile(sm=None, mem=None, bound="compute"))
    assert products.index(L40S) < products.index(A100)
    assert order(make_profile(sm=None, mem=None, bound="unknown"))[0] == []


def test_unknown_profiled_gpu_uses_the_configured_reference():
    products, _ = order(make_profile(product="NVIDIA-Mystery"))
    assert products  # ranked against NVIDIA-A100-SXM4-80GB instead
