"""Collective algorithms and NCCL protocols: the tuner's choices, the theory each algorithm follows,
and published nccl-tests bus bandwidth curves (tests/data/nccl_tests_busbw.csv, a source per point).

nccl-tests bus bandwidth (NVIDIA/nccl-tests doc/PERFORMANCE.md): algbw = size / time; busbw =
algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter and alltoall.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.costs.collectives import collective_s, group_span
from meshplan.io.nccl_tests import launch_floor_s
from meshplan.network.algorithms import nccl_channels, nvls_chunk_bytes
from meshplan.network.tuner import choose

DATA = Path(__file__).parent / "data" / "nccl_tests_busbw.csv"
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}


def measured_cluster(system: str):
    """The catalog cluster each published system is: ND H100 v5, the H100 nodes of nccl-tests
    issues 290 and 309 (8 H100 SXM, 8 NDR 400G NICs each), NCCL issue 1047's node, Together AI's
    and xxrjun's nodes (8 H100 SXM on NVSwitch; xxrjun's 10 nodes reach 49 GB/s a GPU across,
    one 400 Gb/s NIC each) are DGX H100-shaped HGX nodes, NDm A100 v4 a DGX A100-shaped one (8
    HDR NICs, one per GPU); SuperBench's node (8 A100-SXM4-40GB) a DGX A100 40GB; aiconfigurator's
    A100-SXM4-80GB, H100, H200 and B200 nodes the DGX of each, its GB200 and GB300 GPUs an NVL72."""
    if system.startswith(("nd-h100", "h100")):
        return catalog.cluster("dgx-h100")
    for prefix, cluster in (("a100-40g", "dgx-a100-40gb"), ("h200", "dgx-h200"), ("b200", "dgx-b200"),
                            ("gb200", "gb200-nvl72"), ("gb300", "gb300-nvl72")):
        if system.startswith(prefix):
            return catalog.cluster(cluster)
    return catalog.cluster("dgx-a100-80gb")


def curve_points():
    with DATA.open() as f:
        return list(csv.DictReader(f))


def model_busbw(row) -> float:
    """The model's bus bandwidth as the row's run timed it: the collective, or the launches where
    one thread drove several GPUs (``gpus_per_thread``, nccl-tests -g) and they take longer."""
    nodes, ppn = int(row["nodes"]), int(row["gpus_per_node"])
    n = nodes * ppn
    span = group_span(measured_cluster(row["system"]), n, 8 // ppn)
    size = float(row["size_bytes"])
    forced = "ring" if row["system"].endswith("-ring") else "auto"  # run with NCCL_ALGO=Ring
    algorithm, protocol, seconds = choose(row["collective"], size, span, forced)
    floor = launch_floor_s(int(row["gpus_per_thread"]), nccl_channels(size, span, algorithm, protocol))
    seconds = max(seconds, floor)
    return size / seconds * BUS_FACTOR[row["collective"]](n) / 1e9


def measured_busbw(row) -> float:
    """The published bus bandwidth; from the time where one was published (nccl-tests prints
    busbw to 0.01 GB/s, which is 0.00 for the smallest messages)."""
    if row["published"] != "time_us":
        return float(row["busbw_gb_s"])
    n = int(row["nodes"]) * int(row["gpus_per_node"])
    algbw = float(row["size_bytes"]) / (float(row["time_us"]) * 1e-6) / 1e9
    return algbw * BUS_FACTOR[row["collective"]](n)


def test_every_published_point_names_its_source_and_converts_consistently():
    rows = curve_points()
    assert len(rows) >= 180
    for row in rows:
        assert row["source"].startswith("https://github.com/")
        # the bus bandwidth column agrees with the time, to the printout's rounding
        assert float(row["busbw_gb_s"]) == pytest.approx(measured_busbw(row), rel=1e-2, abs=0.006)


#: (system, collective, nodes x gpus per node) curves the model reproduces within 15% bus
#: bandwidth at every published size, smallest to largest
WITHIN_15 = [
    ("nd-h100-v5", "all_gather", 1, 8),  # 21 sizes, 1 KiB - 1 GiB
    ("h100-nccl1047-ring", "reduce_scatter", 1, 8),  # 128 MiB - 8 GiB, ring (NVIDIA/nccl#1047)
    ("ndm-a100-v4", "all_reduce", 1, 8),  # 1 KiB and 1 GiB
    ("ndm-a100-v4", "all_gather", 2, 8),  # 1 GiB and 4 GiB (1 KiB: see below)
    ("ndm-a100-v4", "all_reduce", 2, 8),
    ("ndm-a100-v4", "all_to_all", 2, 8),
]


@pytest.mark.parametrize("system, collective, nodes, ppn", WITHIN_15)
def test_published_nccl_tests_curves_within_15_percent(system, collective, nodes, ppn):
    rows = [r for r in curve_points() if (r["system"], r["collective"], int(r["nodes"]), int(r["gpus_per_node"]))
            == (system, collective, nodes, ppn)]
    if nodes > 1:  # multi-node small messages: NCCL's latency model is 2-3x short (see below)
        rows = [r for r in rows if float(r["size_bytes"]) >= 1 << 20]
    assert rows
    for row in rows:
        assert model_busbw(row) == pytest.approx(measured_busbw(row), rel=0.15), row["size_bytes"]


#: (system, collective, smallest size) of 8-GPU H100 curves the model holds within 15% bus
#: bandwidth from that size to the largest published (8 or 16 GiB): Together AI's node with
#: NCCL's own choices (NCCL 2.26.2) at every size, 8 or 128 B to 8 GiB, each call at least the
#: launches of its one thread driving all 8 GPUs (nccl-tests -g 8: the test below); xxrjun's
#: node (NCCL 2.29.2) from its smallest, 32 MiB
SINGLE_NODE_H100 = [
    (system, collective, smallest)
    for system, smallest in (("h100-together-nvls", 0), ("h100-xxrjun-1n", 32 << 20))
    for collective in ("all_reduce", "all_gather", "reduce_scatter")
]


@pytest.mark.parametrize("system, collective, smallest", SINGLE_NODE_H100)
def test_three_collectives_on_8_h100_within_15_percent(system, collective, smallest):
    rows = [r for r in curve_points() if (r["system"], r["collective"]) == (system, collective)
            and float(r["size_bytes"]) >= smallest]
    assert len(rows) >= 10 and max(float(r["size_bytes"]) for r in rows) >= 8 << 30
    assert smallest > 0 or min(float(r["size_bytes"]) for r in rows) <= 1024
    for row in rows:
        assert model_busbw(row) == pytest.approx(measured_busbw(row), rel=0.15), row["size_bytes"]


def test_ten_h100_nodes_four_collectives_at_bandwidth_within_15_percent():
    """xxrjun's 10 nodes x 8 H100 (NCCL 2.29.2): all-reduce, all-gather and reduce-scatter from
    2 GiB to 16 GiB, all-to-all from 128 MiB; the single node's all-to-all from 64 MiB (from
    1 GiB before NVLink sends ran at P2P_NVLINK_FRACTION of the link). Below that the multi-node
    collectives are the mid-size miss (test_multi_node_h100_mid_sizes_are_a_known_miss), and the
    node's all-to-all is up to 1.22x fast at 32 MiB."""
    checked = 0
    for row in curve_points():
        size, system, kind = float(row["size_bytes"]), row["system"], row["collective"]
        if system == "h100-xxrjun-10n":
            # the sizes are rounded down to a multiple of the 80 ranks
            smallest = (128 << 20 if kind == "all_to_all" else 2 << 30) - (1 << 20)
        elif system == "h100-xxrjun-1n" and kind == "all_to_all":
            smallest = 64 << 20
        else:
            continue
        ratio = model_busbw(row) / measured_busbw(row)
        if size >= smallest:
            assert ratio == pytest.approx(1.0, rel=0.15), (system, kind, size)
            checked += 1
        elif system == "h100-xxrjun-1n":
            assert ratio < 1.25
    assert checked == 3 * 4 + 8 + 9


def test_four_collectives_on_8_a100_at_bandwidth_within_15_percent():
    """SuperBench's 8 x A100-SXM4-40GB node (nccl-tests logs kept as its parser's test data; NCCL
    of about 2021, its version not printed): all-reduce, all-gather, reduce-scatter and all-to-all
    from 512 MiB to 8 GiB, a second system held out of every fit. Below that it is a known miss
    (the next test)."""
    checked = 0
    for row in curve_points():
        if row["system"] == "a100-40g-superbench" and float(row["size_bytes"]) >= 512 << 20:
            assert model_busbw(row) == pytest.approx(measured_busbw(row), rel=0.15), (row["collective"], row["size_bytes"])
            checked += 1
    assert checked == 4 * 5


def _aiconfigurator_errors() -> dict[tuple[str, str, int], list[tuple[float, float]]]:
    """(system, collective, GPUs) -> (size, model busbw / measured - 1) for NVIDIA aiconfigurator's
    nccl-tests sweeps (a thread per GPU, 512 B - 512 MiB, NCCL 2.29.2; A100's 2.27.3)."""
    out: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for row in curve_points():
        if row["system"].endswith("-aiconfigurator"):
            key = (row["system"].split("-")[0], row["collective"], int(row["gpus_per_node"]))
            out.setdefault(key, []).append((float(row["size_bytes"]), model_busbw(row) / measured_busbw(row) - 1))
    return out


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_three_collectives_on_8_hopper_gpus_from_512_bytes(gpu):
    """NVIDIA's own sweeps of one 8-GPU H100 and H200 node (aiconfigurator, NCCL 2.29.2, one
    thread per GPU, so no launch floor), held out of every fit: all-reduce, all-gather and
    reduce-scatter within 15% at two thirds of the 21 sizes from 512 B to 512 MiB and at every
    size from 64 MiB, and within 35% everywhere. The misses: 16-256 KiB up to 34% fast (the
    measured calls step up by 2-4 us at 16-32 KiB, which NCCL's LL model does not have) and
    1-4 MiB up to 25% slow (the measured calls already run at more than LL's bandwidth). Their
    all-to-all is within 15% from 64 MiB, where NVLink sends reach P2P_NVLINK_FRACTION of the
    link (fitted on the H100 curve's slope; the H200's is held out)."""
    errors = _aiconfigurator_errors()
    assert all(abs(e) <= 0.15 for s, e in errors[(gpu, "all_to_all", 8)] if s >= 64 << 20)
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        curve = errors[(gpu, kind, 8)]
        assert len(curve) == 21 and min(s for s, _ in curve) == 512 and max(s for s, _ in curve) == 512 << 20
        assert sum(abs(e) <= 0.15 for _, e in curve) >= 14, kind
        assert all(abs(e) <= 0.15 for s, e in curve if s >= 64 << 20), kind
        assert max(abs(e) for _, e in curve) < 0.35, kind


def test_aiconfigurator_sweeps_known_misses_stay_bounded():
    """Where the same sweeps miss by more: A100 (NCCL 2.27.3) takes 16-23 us for the smallest calls
    where the model, NCCL's tuning latencies, says 11-15 (as H100 takes): up to 2.1x fast;
    Blackwell's calls of 8-32 MiB take up to twice the model's time (B200's all-gather and
    reduce-scatter at 16 MiB twice their 8 MiB time); 4 GPUs of
    a Hopper node reach about 80% of the model's all-gather and reduce-scatter bandwidth at
    128-512 MiB; the all-to-all's smallest calls take 7.3-8.7 us on H100 and H200, as the model
    says, but some sizes 16 us (up to 2.5x fast there), A100's and B200's 10.6-16.6 us; and B200's
    sends reach 0.93 of its link (at NVLink5's fitted efficiency), A100's 0.90 (the H100 fit says
    0.876), so B200's 4-GPU all-to-all is 13-15% fast at 256-512 MiB. Bounded so a regression
    shows."""
    errors = _aiconfigurator_errors()
    worst = {key: max(abs(e) for _, e in curve) for key, curve in errors.items()}
    rings = ("all_reduce", "all_gather", "reduce_scatter")
    assert 0.9 < max(worst[("a100", k, n)] for k in rings for n in (4, 8)) < 1.15
    assert 0.9 < max(worst[(g, k, n)] for g in ("b200", "gb200", "gb300") for k in rings for n in (4, 8)
                     if (g, k, n) in worst) < 1.05
    at_bandwidth = [abs(e) for (g, k, n), curve in errors.items() if g in ("h100", "h200") and k != "all_to_all"
                    for s, e in curve if s >= 128 << 20]
    assert 0.15 < max(at_bandwidth) < 0.25
    assert 1.3 < max(v for (g, k, n), v in worst.items() if k == "all_to_all") < 1.5


def test_blackwell_small_calls_take_their_measured_ll_latency():
    """NVLink5's LL call and ring step (7.47 and 1.252 us, NetworkLevel.ll_call_s / ll_step_s) are
    fitted on NVIDIA's B200 all-reduce, all-gather and reduce-scatter at 512 B on 2, 4 and 8 GPUs,
    where NCCL's table (6.6 and 0.6 us) made them 1.5-2x fast: up to 8 KiB the 4- and 8-GPU calls
    are within 18%, and GB200's and GB300's, held out, within 10%."""
    errors = _aiconfigurator_errors()

    def worst(gpu):
        return max(abs(e) for (g, kind, n), curve in errors.items() if g == gpu and kind != "all_to_all"
                   for size, e in curve if size <= 8192)

    assert worst("b200") < 0.18
    assert max(worst("gb200"), worst("gb300")) < 0.10
    level = catalog.cluster("dgx-b200").levels[0]
    span = group_span(catalog.cluster("dgx-b200"), 8, 1)
    assert collective_s("all_gather", 512, span, "ring", "LL") == pytest.approx(
        level.ll_call_s + 7 * level.ll_step_s + 512 * 7 / 8 / min(0.5 * level.effective_bytes_per_s, level.ll_bytes_per_s),
        rel=1e-9)


def test_nvlink5_ring_efficiency_fits_b200_and_holds_on_gb200_and_gb300():
    """The NVLink5 levels' efficiency (0.71, catalog/clusters.yaml) is fitted on the slope of
    NVIDIA's 8x B200 ring all-gather and reduce-scatter from 256 to 512 MiB (nccl_curves.py
    --fit-nvlink5): those two within 5% from 128 MiB. GB200's and GB300's 4-GPU sweeps, held out:
    all-gather, reduce-scatter and all-reduce within 15% from 64 MiB (at most 15.0%, GB200's
    reduce-scatter at 256 MiB; 26% at the DGX default 0.78 it replaces)."""
    errors = _aiconfigurator_errors()
    fit = [e for kind in ("all_gather", "reduce_scatter") for s, e in errors[("b200", kind, 8)] if s >= 128 << 20]
    assert len(fit) == 6 and max(abs(e) for e in fit) < 0.05
    held = [e for gpu in ("gb200", "gb300") for kind in ("all_gather", "reduce_scatter", "all_reduce")
            for s, e in errors[(gpu, kind, 4)] if s >= 64 << 20]
    assert len(held) == 24 and max(abs(e) for e in held) < 0.1505


def test_one_thread_driving_8_gpus_takes_its_8_launches_a_call():
    """nccl-tests -g 8 (one thread launching each call on all 8 GPUs: Together AI's runs,
    SuperBench's) takes 34-44 us for any call up to 2 MiB, where one rank per GPU (ND H100 v5)
    takes 9.5-38 us: the launches, not the network. They take longer the more channels the call
    runs on: 35 us on one (up to 32 KiB), 41-43 us on all 24 (1-4 MiB), where the collective takes
    17-37 us. With each call at least its launches (io.nccl_tests.launch_floor_s, fitted on
    Together's NVLS all-reduce up to 1 MiB), Together's six curves are within 15% from 8 B to 8
    GiB but one size: the NCCL_ALGO=Ring all-reduce at 256 KiB, 44.2 us (17.9%), where the run
    with NCCL's defaults takes 38.0 us for the same ring (LL, 8 channels). Before the channels
    (8 launches whatever the call) 13 sizes from 256 KiB to 2 MiB were outside, up to 26%; 2-3.5x
    fast without the launches. SuperBench's 8x A100 node, held out, is within 15% up to 16 KiB."""
    outside = [(r["system"], r["collective"], int(r["size_bytes"])) for r in curve_points()
               if r["system"].startswith("h100-together") and abs(model_busbw(r) / measured_busbw(r) - 1.0) > 0.15]
    assert outside == [("h100-together-ring", "all_reduce", 256 << 10)]
    unfloored = [r for r in curve_points() if r["system"].startswith("h100-together") and float(r["size_bytes"]) <= 64 << 10]
    assert len(unfloored) >= 40
    assert all(2.0 < model_busbw({**r, "gpus_per_thread": "1"}) / measured_busbw(r) < 3.5 for r in unfloored)
    small = [r for r in curve_points()
             if r["system"] == "a100-40g-superbench" and r["collective"] != "all_to_all" and float(r["size_bytes"]) <= 16 << 10]
    assert len(small) >= 30
    for r in small:
        assert model_busbw(r) == pytest.approx(measured_busbw(r), rel=0.15), (r["collective"], r["size_bytes"])


def test_superbenchs_older_nccl_is_a_known_miss_between_its_launches_and_its_bandwidth():
    """SuperBench's A100 node's NCCL (unprinted, older) takes up to 2.5x the model's time between
    128 KiB and 256 MiB (75 us for a 1 MiB all-reduce, where ND H100 v5's NCCL 2.18.3 takes 32;
    60 us for a 512 KiB reduce-scatter), and its all-to-all 86-89 us up to 2 MiB (the model: 7 us,
    under 8 launches of 4.43 us); bounded so a regression shows."""
    worst = {}
    for r in curve_points():
        if r["system"] == "a100-40g-superbench":
            worst[r["collective"]] = max(worst.get(r["collective"], 0.0), model_busbw(r) / measured_busbw(r))
    assert 2.2 < max(worst[k] for k in ("all_reduce", "all_gather", "reduce_scatter")) < 2.6
    assert 2.4 < worst["all_to_all"] < 2.9


#: multi-node H100 all-reduce (nccl-tests issue 309: 2 and 4 nodes, NCCL 2.26.2; 2, 4 and 8
#: nodes with NCCL's defaults; 2 nodes with NCCL_ALGO=Ring): the sizes the model holds within 15%
MULTI_NODE_H100 = [
    ("h100-ib-nccltests309-xe9680", 2, 0, 2 << 10),  # 8 B - 2 KiB: tree/LL latency
    ("h100-ib-nccltests309-vm", 4, 0, 1 << 10),
    ("h100-ib-nccltests309-vm", 4, 128 << 20, 1 << 40),  # 128 MiB - 16 GiB
    # the NVLS tree's chunks through its pipeline (nvls_tree_s): 2 nodes from 32 MiB (before
    # NCCL's NVLS chunks were modelled, 2 GiB)
    ("h100-ib-nccltests309-xe9680", 2, 32 << 20, 1 << 40),
    ("h100-ib-nccltests309-gjaion", 2, 32 << 20, 1 << 40),
    ("h100-ib-nccltests309-gjaion", 4, 512 << 20, 1 << 40),
    ("h100-ib-nccltests309-gjaion", 8, 256 << 20, 1 << 40),
    ("h100-ib-nccltests309-gjaion-ring", 2, 32 << 20, 1 << 40),
]


@pytest.mark.parametrize("system, nodes, smallest, largest", MULTI_NODE_H100)
def test_multi_node_h100_all_reduce_within_15_percent(system, nodes, smallest, largest):
    rows = [r for r in curve_points() if r["system"] == system and int(r["nodes"]) == nodes
            and smallest <= float(r["size_bytes"]) <= largest]
    assert len(rows) >= 3
    for row in rows:
        assert model_busbw(row) == pytest.approx(measured_busbw(row), rel=0.15), row["size_bytes"]


def test_multi_node_h100_mid_sizes_are_a_known_miss():
    """Between about 512 KiB and 32 MiB on 2 nodes (256-512 MiB on 4 and 8) the model's
    multi-node all-reduce reaches its bandwidth too soon where it runs the tree with LL128 or
    Simple: NCCL's time there is latency + size / bandwidth (src/graph/tuning.cc), the model's
    form too, while the measured curves take a further 30-200 us, growing with the size (a
    pipeline that fills chunk by chunk, as nvls_tree_s now models the NVLS tree's) before they
    settle. Up to 2.4x fast at 8 MiB on 8 nodes; bounded here so a regression shows."""
    worst = 0.0
    for row in curve_points():
        if row["system"].startswith("h100-ib") and not row["system"].endswith("-ring"):
            worst = max(worst, model_busbw(row) / measured_busbw(row))
    assert 2.0 < worst < 2.5


def test_published_curves_known_misses_stay_bounded():
    """Where the model misses by more than 15% it stays within a stated bound, so a regression
    shows: H100 all-reduce between 32 KiB and 1 MiB is up to 40% fast (NCCL 2.18.3 on ND H100 v5
    takes LL128 or NVLS where today's tuning.cc model keeps LL) and 19% slow at 4 MiB; the 8-GPU A100 all-gather at 1 KiB by 16%;
    multi-node 1 KiB latencies are 1.3-3.2x short of the measurement (NCCL's
    network latencies leave out the proxy round trips a 1 KiB message pays); one GPU per node over HDR
    reaches 16-19 GB/s in the measurement against the catalog's 22.5; ND A100 v4's all-to-all
    (NCCL 2.17.1) takes 9.3 us at 1 KiB where the model says 7.2 (a call and one step: NVIDIA's
    H100 and H200 sweeps take 7.3-8.7) and reaches 255 GB/s at 1 GiB, 20% above the model, where
    NVIDIA's A100 sweep (NCCL 2.27.3) reaches 203 at 512 MiB and SuperBench's 224 at 8 GiB."""
    worst = {}
    for row in curve_points():
        key = (row["system"], row["collective"], int(row["nodes"]))
        error = abs(model_busbw(row) / measured_busbw(row) - 1)
        worst[key] = max(worst.get(key, 0.0), error)
    assert worst[("nd-h100-v5", "all_reduce", 1)] < 0.45
    assert worst[("ndm-a100-v4", "all_gather", 1)] < 0.20
    assert 0.25 < worst[("ndm-a100-v4", "all_to_all", 1)] < 0.35
    assert max(v for (s, c, nodes), v in worst.items() if nodes == 2) < 2.5
    # with NCCL's own algorithms only (no multi-level hierarchical ring), two full nodes' 1 KiB
    # all-reduce and all-gather are within 1.5x
    assert max(worst[("ndm-a100-v4", kind, 2)] for kind in ("all_reduce", "all_gather")) < 0.5


def test_nccl_picks_ll_for_small_ll128_in_between_and_simple_for_large():
    """tuning.cc: LL has the lowest latency and half the bandwidth, Simple the full bandwidth."""
    span = group_span(catalog.cluster("dgx-a100-80gb"), 64, 1)
    assert choose("all_gather", 1e3, span)[1] == "LL"
    assert choose("all_gather", 4e6, span)[1] == "LL128"
    assert choose("all_gather", 4e9, span)[1] == "Simple"


def test_nvls_beats_ring_for_large_all_reduce_but_not_for_small():
    """NVLink SHARP: each GPU sends the buffer once instead of 2(n-1)/n times, but its 25 us
    latency (tuning.cc) loses to an LL ring for small messages (nccl-tests issue 212)."""
    span = group_span(catalog.cluster("dgx-h100"), 8, 1)
    assert choose("all_reduce", 1e9, span)[0] == "nvls"
    assert choose("all_reduce", 1e3, span)[0] == "ring"
    nvls = collective_s("all_reduce", 4 << 30, span, "nvls")
    ring = collective_s("all_reduce", 4 << 30, span, "ring", "Simple")
    level = catalog.cluster("dgx-h100").levels[0]
    # bandwidth terms at NCCL's largest NVLS chunks (a 4 GiB buffer): 1 x buffer / (0.61 x 450
    # GB/s) against 2·7/8 x buffer / (0.82 x 450 GB/s)
    expected = (2 * 7 / 8 / level.efficiency) / (1 / level.reduction_efficiency)
    assert ring / nvls == pytest.approx(expected, rel=0.02)


def test_nvls_runs_smaller_buffers_in_smaller_chunks_at_lower_bandwidth():
    """NCCL halves the NVLS chunk (128 KiB) for buffers under 64, 8 and 2 loops of 16 channels x
    8 heads (enqueue.cc): 1 GiB runs 128 KiB chunks, 512 MiB 64 KiB, 32 MiB 32 KiB and 4 MiB
    16 KiB. A chunk costs 9 KB more than its bytes and the pipeline 1.25 loops more, so by hand
    (0.61 x 450 GB/s at 128 KiB chunks, 25 us latency):
    32 MiB: 8 + 1.25 loops of 128 x (32768 + 9000) B at 274.5 GB/s x 140072 / 131072 (the rate
    of chunks without their cost)."""
    span = group_span(catalog.cluster("dgx-h100"), 8, 1)
    assert [nvls_chunk_bytes(b, 128) for b in (1 << 30, 512 << 20, 64 << 20, 32 << 20, 8 << 20, 4 << 20)] == \
        [131072, 65536, 65536, 32768, 32768, 16384]
    rate = 0.61 * 450e9 * 140072 / 131072
    expected = 25e-6 + (8 + 1.25) * 128 * (32768 + 9000) / rate
    assert collective_s("all_reduce", 32 << 20, span, "nvls") == pytest.approx(expected, rel=1e-9)
    # bandwidth (bytes / time) grows with the buffer, the 8 MiB one's a third of the 1 GiB one's
    # (nccl-tests on 8 H100s: 0.37 with NCCL 2.26.2, 0.41 with 2.18.3)
    speed = [b / collective_s("all_reduce", b, span, "nvls") for b in (8 << 20, 64 << 20, 1 << 30)]
    assert speed[0] < speed[1] < speed[2] and 0.3 < speed[0] / speed[2] < 0.45


def test_sharp_in_the_network_beats_ring_and_tree_across_many_nodes():
    """SHARP (CollNet): across nodes each link sends its share up once and receives it once
    (Graham et al. 2016), against 2(k-1)/k for a ring; NCCL only takes it for large messages.
    One GPU per node (a data-parallel group of tp=8 replicas), so the network sets the pace; with
    every GPU of 32 nodes NVLink's share of the chain slows both alike."""
    base = catalog.cluster("dgx-h100")
    ib = base.levels[1].model_copy(update={"in_network_reduction": True, "reduction_efficiency": 0.9})
    sharp = base.model_copy(update={"levels": (base.levels[0], ib)})
    span = group_span(sharp, 256, 8)
    assert choose("all_reduce", 4e9, span)[0] == "collnet"
    plain = group_span(base, 256, 8)
    assert collective_s("all_reduce", 4e9, span) < 0.7 * collective_s("all_reduce", 4e9, plain)
    whole_nodes = group_span(sharp, 256, 1)  # small messages: the chain inside the node costs more than a tree
    assert choose("all_reduce", 4e9, whole_nodes)[0] == "collnet"
    assert choose("all_reduce", 1e3, whole_nodes)[0] != "collnet"
    assert collective_s("all_reduce", 4e9, whole_nodes) <= collective_s("all_reduce", 4e9, group_span(base, 256, 1))


def test_forced_algorithm_and_protocol():
    span = group_span(catalog.cluster("dgx-a100-80gb"), 8, 1)
    ring_ll = collective_s("all_reduce", 1e6, span, "ring", "LL")
    ring_simple = collective_s("all_reduce", 1e6, span, "ring", "Simple")
    assert ring_ll != ring_simple
    assert collective_s("all_reduce", 1e6, span) <= min(ring_ll, ring_simple)
    # an algorithm the span cannot run falls back to the ring, as NCCL does with NCCL_ALGO
    assert collective_s("all_gather", 1e6, span, "tree") == collective_s("all_gather", 1e6, span, "ring")
    with pytest.raises(ValueError, match="unknown collective algorithm"):
        collective_s("all_reduce", 1e6, span, "butterfly")  # type: ignore[arg-type]


def test_tree_latency_grows_with_log_of_nodes_ring_linearly():
    """Small all-reduce across many nodes: the tree's 2 log2(nodes) network steps beat the ring's
    2(nodes-1) (Sanders et al. 2009; tuning.cc)."""
    cluster = catalog.cluster("dgx-h100")
    span = group_span(cluster, 256, 8)  # one GPU per node, 256 nodes
    tree = collective_s("all_reduce", 1e4, span, "tree")
    ring = collective_s("all_reduce", 1e4, span, "ring")
    assert tree < ring / 10


def test_halving_doubling_and_bucket_take_log_and_dimension_steps_on_a_torus():
    """TPU v4 cube, 64 chips: the ring takes 63 steps a pass, halving-doubling log2(64) = 6,
    the torus bucket algorithm 3 x (4 - 1) = 9 at full injection bandwidth (Jouppi et al. 2023)."""
    cluster = catalog.cluster("tpu-v4-pod")
    span = group_span(cluster, 64, 1)
    lat = cluster.levels[0].latency_s
    tiny = 64.0
    assert collective_s("all_gather", tiny, span, "ring") == pytest.approx(63 * lat, rel=1e-3)
    assert collective_s("all_gather", tiny, span, "halving_doubling") == pytest.approx(6 * lat, rel=1e-3)
    assert collective_s("all_gather", tiny, span, "bucket") == pytest.approx(9 * lat, rel=1e-3)
    # large: the bucket drives all six links, a ring embedded in the torus two of them
    big = 1e10
    level = cluster.levels[0]
    assert collective_s("all_gather", big, span, "bucket") == pytest.approx(
        63 / 64 * big / level.effective_bytes_per_s + 9 * lat, rel=1e-6)
    assert collective_s("all_gather", big, span, "ring") == pytest.approx(
        3 * 63 / 64 * big / level.effective_bytes_per_s + 63 * lat, rel=1e-6)


def test_all_to_all_uses_ll_for_small_peer_chunks_and_simple_above_16_kib():
    span = group_span(catalog.cluster("dgx-a100-80gb"), 8, 1)
    assert choose("all_to_all", 8 * 16384, span)[1] == "LL"
    assert choose("all_to_all", 8 * 16384 + 8, span)[1] == "Simple"


SPANS = [("dgx-a100-80gb", 8, 1), ("dgx-a100-80gb", 64, 1), ("dgx-a100-80gb", 32, 8), ("dgx-h100", 8, 1),
         ("dgx-h100", 512, 1), ("gb200-nvl72", 72, 1), ("gb200-nvl72", 288, 1), ("zionex-a100", 128, 1),
         ("tpu-v4-pod", 64, 1), ("tpu-v4-pod", 4096, 1), ("tpu-v4-pod", 512, 8)]
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SPANS), st.sampled_from(KINDS), st.floats(1.0, 1e10), st.floats(1.0, 4.0))
# a TPU torus all-to-all once took NCCL's LL protocol (half the bandwidth) below 16 KiB a peer
@example(where=("tpu-v4-pod", 4096, 1), kind="all_to_all", size=44739243.0, factor=1.5)
def test_a_bigger_message_is_never_faster(where, kind, size, factor):
    cluster, n, stride = where
    span = group_span(catalog.cluster(cluster), n, stride)
    assert collective_s(kind, size * factor, span) >= collective_s(kind, size, span) * (1 - 1e-12)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SPANS), st.sampled_from(KINDS), st.floats(1.0, 1e10), st.integers(0, 2), st.floats(1.0, 8.0))
def test_more_bandwidth_is_never_slower(where, kind, size, level, factor):
    name, n, stride = where
    cluster = catalog.cluster(name)
    if level >= len(cluster.levels):
        level = len(cluster.levels) - 1
    faster = list(cluster.levels)
    faster[level] = faster[level].model_copy(update={"bytes_per_s": faster[level].bytes_per_s * factor})
    quick = cluster.model_copy(update={"levels": tuple(faster)})
    slow = collective_s(kind, size, group_span(cluster, n, stride))
    assert collective_s(kind, size, group_span(quick, n, stride)) <= slow * (1 + 1e-12)


def test_send_recv_is_bytes_over_the_link_plus_its_latency():
    cluster = catalog.cluster("dgx-h100")
    span = group_span(cluster, 2, 8)
    level = cluster.levels[1]
    assert collective_s("send_recv", 1e8, span) == pytest.approx(1e8 / level.effective_bytes_per_s + level.latency_s)
    assert math.isfinite(collective_s("send_recv", 1.0, span))


def test_nccl_runs_small_calls_on_fewer_channels():
    """enqueue.cc: a ring or tree call runs on its coll channels (24 on an 8-GPU H100 node, as
    NCCL's log prints), one fewer while the buffer is under channels x threads x bytes a thread:
    an 8-GPU LL ring 512 x 8 x 8 B = 32 KiB a channel, LL128 640 x 8 B = 5 KiB, Simple 512 x 64 B
    = 32 KiB, a tree's LL 512 x 8 B = 4 KiB; NVLS always on its NVLS channels (16 on Hopper, 32 on
    Blackwell)."""
    span = group_span(catalog.cluster("dgx-h100"), 8, 1)
    assert [nccl_channels(b, span, "ring", "LL") for b in (8, 64 << 10, 100 << 10, 512 << 10, 768 << 10, 1 << 30)] == \
        [1, 2, 3, 16, 24, 24]
    assert [nccl_channels(b, span, "ring", "LL128") for b in (5119, 5120, 60 << 10, 120 << 10)] == [1, 1, 12, 24]
    assert nccl_channels(96 << 10, span, "ring", "Simple") == 3
    assert nccl_channels(12 << 10, span, "tree", "LL") == 3
    assert nccl_channels(1024, span, "nvls", "Simple") == 16
    assert nccl_channels(1024, group_span(catalog.cluster("dgx-b200"), 8, 1), "nvls", "Simple") == 32
    assert nccl_channels(1 << 30, span, "direct", "Simple") == 1
