"""Each topology changes collective times in the direction and by the amount theory says.

Sources: Leiserson 1985 (fat trees); NVIDIA DGX SuperPOD reference architectures (rail-optimized
fabrics); Dally & Towles 2004 (rings, tori, bisection); Kim et al. ISCA 2008 (dragonfly); Jouppi et
al. ISCA 2023 (TPU v4 torus); DFModel (shared/papers/dfmodel.txt) for bisection-bound all-to-all.
"""

from __future__ import annotations

import pytest

from meshplan import catalog
from meshplan.costs.collectives import collective_s, group_span
from meshplan.errors import MeshplanError
from meshplan.network.topology import bisection_bytes_per_s, fabric, hop_count
from meshplan.specs.base import build
from meshplan.specs.cluster import Cluster, NetworkLevel

B = 100e9  # bytes/s per device per direction
LAT = 1e-6
DEVICE = catalog.device("h100-sxm5-80gb")


def one_level(n: int, **topology) -> Cluster:
    """``n`` devices on one level with no NCCL (ICI-like links: latency_s per step)."""
    level = NetworkLevel(name="fabric", size=n, bytes_per_s=B, latency_s=LAT, link="ici", **topology)
    return Cluster(id="t", name="t", device=DEVICE, levels=(level,))


def nodes_on(fabric_level: dict, nodes: int, per_node: int = 8) -> Cluster:
    """``nodes`` 8-GPU NVLink nodes, one NIC per GPU, on an outer fabric."""
    inner = NetworkLevel(name="nvlink", size=per_node, bytes_per_s=450e9, latency_s=LAT)
    outer = NetworkLevel(name="net", bytes_per_s=B, latency_s=5 * LAT, **fabric_level)
    return Cluster(id="t", name="t", device=DEVICE, levels=(inner, outer))


BIG = 1e10  # large enough that latency is noise


def test_ring_all_to_all_is_bisection_bound_at_n_over_4():
    """A ring's bisection is two links: all-to-all takes n/4 x buffer / b, against (n-1)/n on a switch."""
    n = 16
    ring = collective_s("all_to_all", BIG, group_span(one_level(n, topology="ring"), n, 1))
    switch = collective_s("all_to_all", BIG, group_span(one_level(n, topology="switch"), n, 1))
    assert switch == pytest.approx((n - 1) / n * BIG / B, rel=1e-3)
    assert ring == pytest.approx(n / 4 * BIG / B, rel=1e-3)


def test_ring_topology_runs_the_ring_algorithm_at_full_speed():
    """A bidirectional ring embeds the ring algorithm on its own links: no loss against a switch."""
    n = 16
    ring = collective_s("all_gather", BIG, group_span(one_level(n, topology="ring"), n, 1), "ring")
    switch = collective_s("all_gather", BIG, group_span(one_level(n, topology="switch"), n, 1), "ring")
    assert ring == pytest.approx(switch)


def test_torus_all_to_all_at_its_bisection_bound():
    """4x4x4 torus, six links of b/6: the cut across the longest dimension holds 2·64/4 = 32 links
    (wrap-around), so all-to-all takes (64/4)·buffer / (32·b/6) = 3 x buffer / b (Jouppi et al.
    2023 Sec. 4; Dally & Towles Ch. 5)."""
    cluster = one_level(64, topology="torus-3d", torus_dims=(4, 4, 4))
    fab = fabric(cluster.levels[0], 0)
    assert bisection_bytes_per_s(fab, B, 64) == pytest.approx(32 * B / 6)
    assert collective_s("all_to_all", BIG, group_span(cluster, 64, 1)) == pytest.approx(3 * BIG / B, rel=1e-3)
    # a 2D 8x8 torus: 2·64/8 = 16 links of b/4 across: 64/4 / (16/4) = 4 x
    flat = one_level(64, topology="torus-2d", torus_dims=(8, 8))
    assert collective_s("all_to_all", BIG, group_span(flat, 64, 1)) == pytest.approx(4 * BIG / B, rel=1e-3)


def test_two_to_one_oversubscription_halves_cross_spine_bandwidth():
    """Leaves of 4 nodes: all-to-all among 16 nodes sends 12/16 of every buffer through the spine.
    At 2:1 the up-links carry half a device's bandwidth, so that part takes twice as long
    (Leiserson 1985); inside one leaf nothing changes."""
    full = nodes_on(dict(topology="fat-tree", leaf_domains=4), 16, per_node=1)
    half = nodes_on(dict(topology="fat-tree", leaf_domains=4, oversubscription=2.0), 16, per_node=1)
    span_full, span_half = group_span(full, 16, 1), group_span(half, 16, 1)
    a2a_full = collective_s("all_to_all", BIG, span_full)
    a2a_half = collective_s("all_to_all", BIG, span_half)
    assert a2a_full == pytest.approx(15 / 16 * BIG / B, rel=1e-2)
    assert a2a_half == pytest.approx(2 * 12 / 16 * BIG / B, rel=1e-2)
    # one member per leaf: a ring's leaf-crossing edges get half the bandwidth
    sparse_full, sparse_half = group_span(full, 4, 4), group_span(half, 4, 4)
    ring_full = collective_s("all_gather", BIG, sparse_full, "ring", "Simple")
    ring_half = collective_s("all_gather", BIG, sparse_half, "ring", "Simple")
    assert ring_half == pytest.approx(2 * ring_full, rel=1e-2)
    # inside one leaf the taper is invisible
    assert collective_s("all_to_all", BIG, group_span(half, 4, 1)) == pytest.approx(
        collective_s("all_to_all", BIG, group_span(full, 4, 1)))
    assert bisection_bytes_per_s(fabric(half.levels[1], 1), B, 16) == pytest.approx(
        bisection_bytes_per_s(fabric(full.levels[1], 1), B, 16) / 2)


def test_rail_optimized_fabric_keeps_rail_aligned_rings_on_one_leaf():
    """DGX SuperPOD: GPU r of every node is on rail leaf r. A data-parallel ring of same-rank GPUs
    stays on one leaf up to leaf_domains nodes (2 hops), and climbs to the spine beyond (4)."""
    rail = nodes_on(dict(topology="rail-optimized", leaf_domains=32), 64)
    fab = fabric(rail.levels[1], 1)
    assert hop_count(fab, 32) == 2 and hop_count(fab, 64) == 4
    # a tapered rail fabric: only one GPU of each node is under a rail leaf, so a fat tree with the
    # same leaves keeps 8x more of a stride-1 group under each leaf
    tapered_rail = nodes_on(dict(topology="rail-optimized", leaf_domains=4, oversubscription=4.0), 16)
    tapered_tree = nodes_on(dict(topology="fat-tree", leaf_domains=4, oversubscription=4.0), 16)
    dp_rail = group_span(tapered_rail, 16, 8)  # one GPU per node, 16 nodes over 4 leaves
    dp_tree = group_span(tapered_tree, 16, 8)
    assert collective_s("all_gather", BIG, dp_rail, "ring", "Simple") == pytest.approx(
        collective_s("all_gather", BIG, dp_tree, "ring", "Simple"))


def test_dragonfly_global_links_bound_inter_group_traffic():
    """Dragonfly groups of 4 domains, global links at a quarter of a device's bandwidth: the part
    of an all-to-all that leaves a group (12/16 of 16 domains) runs at b/4 (Kim et al. 2008);
    within one group, at full speed."""
    balanced = nodes_on(dict(topology="dragonfly", group_domains=4, global_taper=1.0), 16, per_node=1)
    tapered = nodes_on(dict(topology="dragonfly", group_domains=4, global_taper=0.25), 16, per_node=1)
    assert collective_s("all_to_all", BIG, group_span(balanced, 16, 1)) == pytest.approx(15 / 16 * BIG / B, rel=1e-2)
    assert collective_s("all_to_all", BIG, group_span(tapered, 16, 1)) == pytest.approx(4 * 12 / 16 * BIG / B, rel=1e-2)
    assert collective_s("all_to_all", BIG, group_span(tapered, 4, 1)) == pytest.approx(
        collective_s("all_to_all", BIG, group_span(balanced, 4, 1)))
    assert hop_count(fabric(tapered.levels[1], 1), 16) == 3  # local, global, local


def test_fully_connected_has_switch_bandwidth_and_one_link_hops():
    n = 8
    mesh = one_level(n, topology="fully-connected")
    switch = one_level(n, topology="switch")
    for kind in ("all_to_all", "all_gather"):
        assert collective_s(kind, BIG, group_span(mesh, n, 1)) == pytest.approx(
            collective_s(kind, BIG, group_span(switch, n, 1)), rel=1e-6)
    assert hop_count(fabric(mesh.levels[0], 0), n) == 1


@pytest.mark.parametrize("domain", [8, 72, 576])
def test_nvlink_domains_keep_a_group_inside_one_switch_level(domain):
    """NVLink domains of 8 (DGX), 72 (NVL72) and 576 GPUs: a tensor-parallel group inside the
    domain never touches the network, and its all-reduce runs at NVLink speed with NVLS."""
    inner = NetworkLevel(name="nvlink", size=domain, bytes_per_s=900e9, latency_s=LAT, efficiency=0.78,
                         in_network_reduction=True, reduction_efficiency=0.53)
    outer = NetworkLevel(name="ib", bytes_per_s=50e9, latency_s=5 * LAT, efficiency=0.9)
    cluster = Cluster(id="t", name="t", device=DEVICE, levels=(inner, outer))
    span = group_span(cluster, domain, 1)
    assert span.levels == (0,)
    nvls_latency = 25e-6  # tuning.cc hwLatencies, NVLS over NVLink
    # NCCL's chunks cost a little more than their bytes where more heads make them smaller
    # (network.algorithms.nvls_s): 10 GB on 8 GPUs runs 128 KiB chunks, on 32 heads or more 64 KiB
    expected = BIG / (900e9 * 0.53) + nvls_latency
    assert expected <= collective_s("all_reduce", BIG, span) < expected * (1.01 if domain == 8 else 1.2)
    across = group_span(cluster, 2 * domain, 1)
    assert collective_s("all_reduce", BIG, across) > 2 * collective_s("all_reduce", BIG, span)


def test_catalog_clusters_carry_their_real_topology():
    a100 = catalog.cluster("dgx-a100-80gb")
    h100 = catalog.cluster("dgx-h100")
    assert a100.levels[1].topology == h100.levels[1].topology == "rail-optimized"
    assert h100.levels[0].in_network_reduction and not a100.levels[0].in_network_reduction
    assert catalog.cluster("gb200-nvl72").levels[0].size == 72
    tpu = catalog.cluster("tpu-v4-pod")
    assert tpu.levels[0].torus_dims == (4, 4, 4) and tpu.levels[1].torus_dims == (4, 4, 4)
    for cluster in (a100, h100, tpu):
        for level in cluster.levels:
            for field in ("topology", "leaf_domains", "in_network_reduction", "reduction_efficiency",
                          "ll_bytes_per_s", "torus_dims"):
                if field in level.model_fields_set and field != "topology":
                    assert f"levels.{level.name}.{field}" in cluster.sources or field == "torus_dims"


@pytest.mark.parametrize("level, field", [
    (dict(topology="torus-3d", torus_dims=[4, 4]), "torus_dims"),
    (dict(topology="switch", torus_dims=[4, 4, 4]), "torus_dims"),
    (dict(topology="dragonfly"), "group_domains"),
    (dict(topology="switch", oversubscription=2.0), "oversubscription"),
    (dict(topology="ring", leaf_domains=4), "leaf_domains"),
    (dict(topology="switch", group_domains=4), "group_domains"),
    (dict(topology="fat-tree", oversubscription=2.0), "leaf_domains"),
    (dict(topology="fat-tree", oversubscription=0.5, leaf_domains=4), "oversubscription"),
    (dict(topology="hypercube"), "topology"),
    (dict(reduction_efficiency=1.5), "reduction_efficiency"),
])
def test_bad_topology_names_the_field(level, field):
    data = dict(name="x", bytes_per_s="100 GB/s", latency_s="1 us", **level)
    with pytest.raises(MeshplanError) as err:
        build(NetworkLevel, data, "cluster.levels.0")
    assert err.value.field == f"cluster.levels.0.{field}"


def test_torus_must_hold_the_levels_domains():
    inner = NetworkLevel(name="chip", size=64, bytes_per_s=B, latency_s=LAT, topology="torus-3d",
                         torus_dims=(4, 4, 4), link="ici")
    outer = dict(name="pod", size=4096, bytes_per_s=B, latency_s=LAT, topology="torus-3d", torus_dims=(4, 4, 2),
                 link="ici")
    with pytest.raises(MeshplanError) as err:
        build(Cluster, dict(id="t", name="t", device=DEVICE, levels=[inner, outer]), "cluster")
    assert err.value.field == "cluster.levels.1.torus_dims"
