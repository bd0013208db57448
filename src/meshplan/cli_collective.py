"""``meshplan collective``: the network model's time of one collective at each size, as
nccl-tests prints a curve, and beside the user's own nccl-tests output."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Optional

import typer

from meshplan.cli_query import console
from meshplan.errors import MeshplanError


def collective(
    kind: Optional[str] = typer.Argument(None, help="all_reduce, all_gather, reduce_scatter or all_to_all (with --nccl-tests: only that test, or the one a bare table holds)."),
    cluster: str = typer.Option(..., help="Catalog cluster id (meshplan catalog list clusters)."),
    devices: Optional[int] = typer.Option(None, help="Ranks in the collective (with --nccl-tests: default the ranks the log lists)."),
    stride: Optional[int] = typer.Option(None, help="Ranks between consecutive members, as a plan's groups sit (default 1; with --nccl-tests: devices per node over the log's ranks per host)."),
    sizes: str = typer.Option("1K:8G", help="Buffer sizes: MIN:MAX doubling, or a comma list (K, M, G = 1024^n, as nccl-tests' -b/-e)."),
    algorithm: str = typer.Option("auto", help="Force an algorithm, as NCCL_ALGO (ring, tree, nvls, nvls_tree, collnet, ...)."),
    protocol: str = typer.Option("auto", help="Force a protocol, as NCCL_PROTO (LL, LL128, Simple)."),
    nccl_tests: Optional[Path] = typer.Option(None, "--nccl-tests", help="nccl-tests output to compare with: its sizes, ranks and hosts; every test in it."),
    in_place: bool = typer.Option(False, "--in-place", help="Compare with the in-place columns (default: out-of-place)."),
    profile: Optional[Path] = typer.Option(None, help="A measured profile (meshplan calibrate) for the cluster's device."),
    as_json: bool = typer.Option(False, "--json", help="Print one object per size as JSON."),
):
    """Time one collective at each size: algorithm, protocol, bus bandwidth; beside nccl-tests output."""
    from meshplan import api

    resolved = api.resolve_cluster(cluster, str(profile) if profile else None)
    curves = []
    if nccl_tests is None:
        if kind is None or devices is None:
            raise MeshplanError("kind" if kind is None else "--devices", None,
                                "a collective and --devices (or --nccl-tests FILE to take them from)")
        from meshplan.io.nccl_tests import size_sweep

        curves.append(api.collective(kind, resolved, devices, size_sweep(sizes), 1 if stride is None else stride, algorithm, protocol))
    else:
        from meshplan.costs.collectives import CURVE_KINDS
        from meshplan.io.nccl_tests import LAUNCH_PER_CHANNEL_S, LAUNCH_PER_GPU_S, launch_floor_s, read_nccl_tests

        skipped = []
        launched = set()  # GPUs one thread drove (nccl-tests -g), where more than one
        for test in read_nccl_tests(nccl_tests):
            test_kind = test.collective or kind
            if test_kind is None:
                raise MeshplanError("kind", None, f"the collective of {nccl_tests}'s bare table (all_reduce, all_gather, reduce_scatter or all_to_all)")
            if kind is not None and test.collective is not None and test.collective != kind:
                continue
            if kind is None and test_kind not in CURVE_KINDS:
                skipped.append(test_kind)
                continue
            ranks = devices or test.ranks
            if not ranks:
                raise MeshplanError("--devices", None, f"the ranks of {nccl_tests}, which lists none")
            if test.gpus_per_thread > 1:
                launched.add(test.gpus_per_thread)
            per_host = max(1, ranks // test.nodes)
            measured = [row[2] if in_place else row[1] for row in test.rows]
            curves.append(api.collective(test_kind, resolved, ranks, [row[0] for row in test.rows],
                                         max(1, resolved.devices_per_node // per_host) if stride is None else stride,
                                         algorithm, protocol, measured, gpus_per_thread=test.gpus_per_thread))
        if not curves:
            raise MeshplanError("kind", kind, f"a collective {nccl_tests} holds a test of (all_reduce, all_gather, reduce_scatter or all_to_all)")
        for name in skipped:
            console(stderr=True).print(f"note: {name} left out: meshplan draws all_reduce, all_gather, reduce_scatter and all_to_all")
        for gpus in sorted(launched):
            console(stderr=True).print(
                f"note: one thread drove {gpus} GPUs (nccl-tests -g {gpus}): a call takes at least its {gpus} launches, "
                f"{launch_floor_s(gpus) * 1e6:.1f} us on one channel ({LAUNCH_PER_GPU_S * 1e6:.2f} us each and "
                f"{LAUNCH_PER_CHANNEL_S * 1e9:.0f} ns more a further channel, fitted on Together AI's 8x H100 node); "
                f"'as timed' is the longer of that and the collective, and the error is against it")
    if as_json:
        typer.echo(json.dumps([p.as_dict() for curve in curves for p in curve], indent=2))
        return
    for curve in curves:
        _print_curve(curve, resolved.id)


def _print_curve(curve, cluster_id: str) -> None:
    from rich.table import Table

    from meshplan.units import format_bytes

    first = curve[0]
    measured = first.measured_time_s is not None
    launched = first.launch_s > 0
    table = Table(title=f"{first.kind} over {first.ranks} devices of {cluster_id}", header_style="bold",
                  caption="error: the model's bus bandwidth over the measured, less one (+: the model is faster)" if measured else None)
    for column in ("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "algorithm"):
        table.add_column(column, justify="left" if column in ("size", "algorithm") else "right")
    if launched:
        table.add_column("as timed (us)", justify="right")
    if measured:
        for column in ("measured (us)", "measured busbw", "error"):
            table.add_column(column, justify="right")
    for p in curve:
        row = [format_bytes(p.size_bytes), f"{p.time_s * 1e6:.2f}", f"{p.size_bytes / p.time_s / 1e9:.2f}",
               f"{p.busbw(p.time_s) / 1e9:.2f}", f"{p.algorithm}/{p.protocol}"]
        if launched:
            row.append(f"{p.timed_s * 1e6:.2f}")
        if measured:
            row += [f"{p.measured_time_s * 1e6:.2f}", f"{p.busbw(p.measured_time_s) / 1e9:.2f}", f"{p.error:+.1%}"]
        table.add_row(*row)
    console().print(table)
    if measured:
        errors = [abs(p.error) for p in curve]
        worst = max(curve, key=lambda p: abs(p.error))
        console(stderr=True).print(
            f"bus bandwidth error: median {statistics.median(errors):.1%}, largest {worst.error:+.1%} at "
            f"{format_bytes(worst.size_bytes)}; {sum(e <= 0.15 for e in errors)} of {len(errors)} sizes within 15%")
