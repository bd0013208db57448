"""``meshplan collective``: the model's curve of one collective, and beside nccl-tests output
(meshplan.io.nccl_tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run_cli
from meshplan import catalog
from meshplan.costs.collectives import collective_s, group_span
from meshplan.errors import MeshplanError
from meshplan.io.nccl_tests import LAUNCH_PER_CHANNEL_S, LAUNCH_PER_GPU_S, read_nccl_tests

#: all_reduce and all_gather on one 8x H100 node, 32 MiB - 16 GiB (xxrjun/nccl-tests-cluster)
LOG = Path(__file__).parent / "data" / "nccl_tests_h100_node.log"
ROW = "{size:>12d} {count:>12d}     float     sum      -1   {t:7.2f}   0.00   0.00       0   {t2:7.2f}   0.00   0.00       0"


def run_json(monkeypatch, capsys, *args):
    code, out, err = run_cli(monkeypatch, capsys, "collective", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_reads_every_test_of_an_nccl_tests_log_with_its_ranks_hosts_and_both_columns():
    tests = read_nccl_tests(LOG)
    assert [t.collective for t in tests] == ["all_reduce", "all_gather"]
    assert all((t.ranks, t.nodes, len(t.rows)) == (8, 1, 10) for t in tests)
    assert tests[0].rows[0] == (33554432.0, pytest.approx(182.87e-6), pytest.approx(182.88e-6))
    assert tests[1].rows[-1] == (17179869184.0, pytest.approx(41542.0e-6), pytest.approx(41454.3e-6, rel=0.01))


def test_a_curve_holds_the_models_time_and_nccl_tests_bandwidths(monkeypatch, capsys):
    points = run_json(monkeypatch, capsys, "all_reduce", "--cluster", "dgx-h100", "--devices", "8", "--sizes", "1K:4K")
    assert [p["size_bytes"] for p in points] == [1024, 2048, 4096]
    span = group_span(catalog.cluster("dgx-h100"), 8, 1)
    for p in points:
        assert p["time_s"] == pytest.approx(collective_s("all_reduce", p["size_bytes"], span))
        assert p["algbw_bytes_per_s"] == pytest.approx(p["size_bytes"] / p["time_s"])
        assert p["busbw_bytes_per_s"] == pytest.approx(p["algbw_bytes_per_s"] * 2 * 7 / 8)
        assert (p["algorithm"], p["protocol"]) == ("ring", "LL")
    big = run_json(monkeypatch, capsys, "all_reduce", "--cluster", "dgx-h100", "--devices", "8", "--sizes", "1G")
    assert (big[0]["algorithm"], big[0]["protocol"]) == ("nvls", "Simple")
    forced = run_json(monkeypatch, capsys, "all_reduce", "--cluster", "dgx-h100", "--devices", "8", "--sizes", "1G",
                      "--algorithm", "Ring", "--protocol", "simple")
    assert (forced[0]["algorithm"], forced[0]["protocol"]) == ("ring", "Simple")
    assert forced[0]["time_s"] > big[0]["time_s"]


def test_beside_nccl_tests_output_every_size_has_its_error(monkeypatch, capsys):
    points = run_json(monkeypatch, capsys, "--cluster", "dgx-h100", "--nccl-tests", str(LOG))
    assert len(points) == 20 and {p["kind"] for p in points} == {"all_reduce", "all_gather"}
    for p in points:
        assert p["error"] == pytest.approx(p["measured_time_s"] / p["time_s"] - 1)
        assert p["busbw_bytes_per_s"] == pytest.approx(p["measured_busbw_bytes_per_s"] * (1 + p["error"]))
        assert abs(p["error"]) < 0.15  # this node's curves are within 15% (tests/test_collective_algorithms.py)
    gathers = run_json(monkeypatch, capsys, "all_gather", "--cluster", "dgx-h100", "--nccl-tests", str(LOG), "--in-place")
    assert len(gathers) == 10 and gathers[-1]["measured_time_s"] == pytest.approx(41454.3e-6, rel=0.01)
    code, out, err = run_cli(monkeypatch, capsys, "collective", "--cluster", "dgx-h100", "--nccl-tests", str(LOG))
    assert code == 0 and "all_gather over 8 devices of dgx-h100" in out and "10 of 10 sizes within 15%" in err


def test_hosts_in_the_log_place_the_group_across_nodes(tmp_path, monkeypatch, capsys):
    """Two hosts with four ranks each on 8-GPU nodes: four GPUs a node, two nodes (stride 2)."""
    ranks = [f"#  Rank {r} Group  0 Pid {100 + r} on node{r // 4} device {r % 4} [0x1b] NVIDIA H100 80GB HBM3" for r in range(8)]
    rows = [ROW.format(size=s, count=s // 4, t=100.0, t2=101.0) for s in (1 << 20, 1 << 30)]
    log = tmp_path / "two_hosts.log"
    log.write_text("\n".join(["# Collective test starting: all_reduce_perf", *ranks, *rows]) + "\n")
    points = run_json(monkeypatch, capsys, "--cluster", "dgx-h100", "--nccl-tests", str(log))
    span = group_span(catalog.cluster("dgx-h100"), 8, 2)
    assert len(span.hops) == 2
    assert [p["time_s"] for p in points] == pytest.approx([collective_s("all_reduce", s, span) for s in (1 << 20, 1 << 30)])


def test_a_bare_table_needs_its_collective(tmp_path, monkeypatch, capsys):
    log = tmp_path / "bare.txt"
    log.write_text(ROW.format(size=1 << 20, count=1 << 18, t=40.0, t2=41.0) + "\n")
    code, _, err = run_cli(monkeypatch, capsys, "collective", "--cluster", "dgx-h100", "--devices", "8", "--nccl-tests", str(log))
    assert code == 2 and err.startswith("error: kind:")
    points = run_json(monkeypatch, capsys, "reduce_scatter", "--cluster", "dgx-h100", "--devices", "8", "--nccl-tests", str(log))
    assert points[0]["kind"] == "reduce_scatter" and points[0]["measured_time_s"] == pytest.approx(40e-6)


@pytest.mark.parametrize("args, field", [
    (["broadcast", "--devices", "8"], "kind"),
    (["all_reduce"], "--devices"),
    (["all_reduce", "--devices", "1"], "devices"),
    (["all_reduce", "--devices", "100000"], "num_devices"),
    (["all_reduce", "--devices", "8", "--sizes", "8G:1K"], "--sizes"),
    (["all_reduce", "--devices", "8", "--sizes", "lots"], "--sizes"),
    (["all_gather", "--devices", "8", "--algorithm", "nvls"], "algorithm"),
    (["all_reduce", "--devices", "8", "--algorithm", "fastest"], "algorithm"),
    (["all_reduce", "--devices", "8", "--protocol", "LL256"], "protocol"),
    (["all_reduce", "--devices", "8", "--stride", "0"], "stride"),
    (["--nccl-tests", "no/such/file.log"], "--nccl-tests"),
    (["--nccl-tests", str(Path(__file__))], "--nccl-tests"),  # no table in it
    (["all_to_all", "--nccl-tests", str(LOG)], "kind"),  # no such test in the log
])
def test_bad_input_is_one_error_line(monkeypatch, capsys, args, field):
    code, out, err = run_cli(monkeypatch, capsys, "collective", "--cluster", "dgx-h100", *args)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {field}") and err.count("\n") == 1, err


def test_tests_it_does_not_draw_are_left_out_with_a_note(tmp_path, monkeypatch, capsys):
    log = tmp_path / "mixed.log"
    log.write_text("# Collective test starting: sendrecv_perf\n" + ROW.format(size=1 << 20, count=1 << 18, t=10.0, t2=10.0)
                   + "\n" + LOG.read_text())
    code, out, err = run_cli(monkeypatch, capsys, "collective", "--cluster", "dgx-h100", "--nccl-tests", str(log), "--json")
    assert code == 0 and len(json.loads(out)) == 20
    assert "note: send_recv left out" in err


#: the header and rows of nccl-tests logs older than 2.13, as SuperBench keeps them for its parser
#: (github.com/microsoft/superbenchmark tests/data/nccl_allgather.log and nccl_alltoall.log:
#: 8 A100-SXM4-40GB, one thread driving all 8): rank lines without a group, rows without root,
#: and all_gather's without a redop, alltoall's with a blank one
OLD_HEADER = ["# nThread 1 nGpus 8 minBytes 1 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 validation: 0",
              "#", "# Using devices",
              *[f"#   Rank  {r} Pid 112372 on localhost device  {r} [0x00] A100-SXM4-40GB" for r in range(8)]]
OLD_GATHER = ["#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error",
              "           0             0   float    34.27    0.00    0.00    N/A    33.57    0.00    0.00    N/A",
              "     1048576         32768   float    72.95   14.37   12.58    N/A    73.07   14.35   12.56    N/A",
              "  8589934592     268435456   float    33646  255.31  223.39    N/A    32669  262.94  230.07    N/A"]
OLD_ALLTOALL = ["#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
                "          32             1   float            89.00    0.00    0.00    N/A    85.13    0.00    0.00    N/A",
                "  8589934592     268435456   float            33508  256.36  224.31    N/A    33234  258.47  226.16    N/A"]


@pytest.mark.parametrize("rows, kind, first, channels", [(OLD_GATHER, "all_gather", (1048576.0, 72.95e-6, 73.07e-6), 24),
                                                           (OLD_ALLTOALL, "all_to_all", (32.0, 89.0e-6, 85.13e-6), 1)])
def test_reads_older_nccl_tests_logs_and_notes_one_thread_driving_every_gpu(tmp_path, monkeypatch, capsys, rows, kind, first,
                                                                           channels):
    log = tmp_path / "old.log"
    log.write_text("\n".join([*OLD_HEADER, *rows]) + "\n")
    (test,) = read_nccl_tests(log)
    assert (test.collective, test.ranks, test.nodes, test.gpus_per_thread, len(test.rows)) == (None, 8, 1, 8, 2)
    assert test.rows[0] == pytest.approx(first) and test.rows[-1][0] == 8589934592.0
    code, out, err = run_cli(monkeypatch, capsys, "collective", kind, "--cluster", "dgx-a100-40gb", "--nccl-tests", str(log), "--json")
    points = json.loads(out)
    assert code == 0 and [p["size_bytes"] for p in points] == [first[0], 8589934592]
    assert "note: one thread drove 8 GPUs (nccl-tests -g 8)" in err
    # each call takes at least its 8 launches, on every channel (an all-gather of 1 MiB or more
    # runs on all 24 of the A100 node's), and the error is against the longer of the two
    for p in points:
        assert p["launch_floor_s"] == pytest.approx(8 * (LAUNCH_PER_GPU_S + (channels - 1) * LAUNCH_PER_CHANNEL_S))
        assert p["timed_s"] == max(p["time_s"], p["launch_floor_s"])
        assert p["error"] == pytest.approx(p["measured_time_s"] / p["timed_s"] - 1.0)
    assert points[-1]["timed_s"] == points[-1]["time_s"]  # 8 GiB: the collective, not the launches
    code, table, _ = run_cli(monkeypatch, capsys, "collective", kind, "--cluster", "dgx-a100-40gb", "--nccl-tests", str(log))
    assert code == 0 and "as timed (us)" in table and f"{points[0]['timed_s'] * 1e6:.2f}" in table
    assert "drove" not in run_cli(monkeypatch, capsys, "collective", "--cluster", "dgx-h100", "--nccl-tests", str(LOG))[2]


def test_a_thread_driving_several_gpus_floors_each_call_at_their_launches():
    """api.collective(gpus_per_thread=G): a small call is timed at G launches (4.44 us each on one
    channel, 34.8 ns more a GPU for each further channel: an 8-GPU LL ring runs a channel per
    32 KiB of buffer, all 24 from 768 KiB), a large one at the collective; one thread a GPU (the
    default) has no floor."""
    from meshplan import api

    small, mid, large = api.collective("all_reduce", "dgx-h100", 8, [1024, 512 << 10, 1 << 30], gpus_per_thread=8)
    assert small.time_s < 20e-6 and small.timed_s == pytest.approx(8 * LAUNCH_PER_GPU_S)
    assert (mid.algorithm, mid.protocol) == ("ring", "LL") and mid.time_s < 25e-6
    assert mid.timed_s == pytest.approx(8 * (LAUNCH_PER_GPU_S + 15 * LAUNCH_PER_CHANNEL_S))  # 16 channels
    assert large.timed_s == large.time_s > 1e-3
    ungrouped = api.collective("all_reduce", "dgx-h100", 8, [1024, 512 << 10, 1 << 30])
    assert [p.timed_s for p in ungrouped] == [small.time_s, mid.time_s, large.time_s]


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "8"])
def test_a_bad_gpus_per_thread_names_the_field(value):
    from meshplan import api

    with pytest.raises(MeshplanError) as err:
        api.collective("all_reduce", "dgx-h100", 8, [1024], gpus_per_thread=value)
    assert err.value.field == "gpus_per_thread"
