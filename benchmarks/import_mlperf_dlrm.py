"""Turn MLPerf Training DLRM-DCNv2 result logs into validation cases (tests/data/mlperf_dlrm.yaml).

    python benchmarks/import_mlperf_dlrm.py --release v4.0 --commit <sha> \
        NVIDIA/results/eos_ngc24.04_merlin_hugectr/dlrm_dcnv2/result_*.txt ... > cases.yaml

Each argument is a result log of github.com/mlcommons/training_results_<release> (read from a
checkout); the logs of one system directory make one case (v4.1 repeats v4.0's eos_ngc24.04 and
h200 logs: leave those out). A log's steps are timed between its evaluations: from each
``epoch_start`` or ``eval_stop`` to the next ``eval_start``, the samples of that block are its
``epoch_num`` difference times the training set (train.py TRAIN_NUM_SAMPLES, 4,195,197,692), so
the evaluations (the logged ``tracked_stats`` throughput includes them) and the start-up are left
out. A log's step time is the median over its blocks; the case's, the median over its logs. The
model is the reference DLRM-DCNv2 (meshplan's ``mlperf-dlrm-dcnv2`` entry); the plan is the
validation default (tables model-parallel over every GPU, dense layers data parallel); precision
fp16: the configs set HugeCTR's mixed precision (the log does not record it).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import yaml

TRAIN_SAMPLES = 4_195_197_692
LINE = re.compile(r"^:::MLLOG (\{.*\})\s*$")

#: the system in the log's submission_platform ("8xNVIDIA DGX H100", "2xNVIDIA GB200") -> (cluster
#: id, GPUs per node or tray); GB200 before B200, which it contains
CLUSTERS = {
    "GB200": ("gb200-nvl72", 4),
    "B200": ("dgx-b200", 8),
    "H200": ("dgx-h200", 8),
    "H100": ("dgx-h100", 8),
}
PLATFORM = re.compile(r"^(?P<nodes>\d+)xNVIDIA (?P<system>.+)$")


def events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m:
            out.append(json.loads(m.group(1)))
    return out


def value(evs: list[dict], key: str):
    return next((e["value"] for e in evs if e["key"] == key), None)


def step_times(evs: list[dict], batch: int) -> list[float]:
    """Seconds per step of each block between two evaluations."""
    out, start = [], None
    for e in evs:
        key, epoch = e["key"], e["metadata"].get("epoch_num")
        if key in ("epoch_start", "eval_stop") and epoch is not None:
            start = (e["time_ms"], float(epoch))
        elif key == "eval_start" and start is not None:
            samples = (float(epoch) - start[1]) * TRAIN_SAMPLES
            if samples > 0:
                out.append((e["time_ms"] - start[0]) / 1e3 * batch / samples)
            start = None
    return out


def model() -> dict:
    """The reference model's fields (catalog/dlrm.yaml, mlperf-dlrm-dcnv2), as a case states them."""
    from meshplan import catalog

    entry = catalog.entry("dlrm", "mlperf-dlrm-dcnv2")
    return {"name": "MLPerf DLRM-DCNv2", "arch": "dlrm",
            **{k: v for k, v in entry.items() if k not in ("name", "sources")}}


def case(logs: list[Path], release: str, commit: str) -> dict:
    evs = events(logs[0])
    batch = int(value(evs, "global_batch_size"))
    platform = PLATFORM.match(value(evs, "submission_platform") or "")
    cluster = platform and next((c for name, c in CLUSTERS.items() if name in platform["system"]), None)
    if cluster is None:
        raise SystemExit(f"error: no cluster for submission_platform {value(evs, 'submission_platform')!r} in {logs[0]}")
    nodes, per_node = int(platform["nodes"]), cluster[1]
    per_log = [statistics.median(step_times(events(p), batch)) for p in logs]
    step = statistics.median(per_log)
    directory = logs[0].parent.parent.name
    submitter = logs[0].parts[0]
    return {
        "id": f"mlperf{release.replace('.', '').lstrip('v')}_{directory}_dlrm_dcnv2",
        "group": f"mlperf_dlrm_{cluster[0].replace('-', '_')}",
        "source": (f"MLCommons Training {release}, {submitter} {directory}, DLRM-DCNv2 on {nodes * per_node} GPUs "
                   f"({platform[0]}); logs https://github.com/mlcommons/training_results_{release}/blob/"
                   f"{commit}/{logs[0].as_posix()} (and the other {len(logs) - 1} of the directory)"),
        "model": model(),
        "hardware": {"cluster": cluster[0], "num_devices": nodes * per_node, "devices_per_node": per_node},
        "batch": {"global_batch_samples": batch},
        "precision": "fp16",
        "framework": "hugectr",
        "measured": {"step_time_s": round(step, 7)},
        "target_basis": (f"median over {len(logs)} logs of each log's median block between evaluations "
                         f"(per log: {', '.join(f'{t * 1e3:.4f}' for t in sorted(per_log))} ms)"),
        "inferred": ["precision fp16: the implementation's configs set USE_MIXED_PRECISION=true (HugeCTR mixed "
                     "precision, fp16 dense layers with a loss scale), which the log does not record",
                     "plan: the validation default (tables model-parallel, dense layers data parallel); HugeCTR "
                     "shards by its own planner (SHARDING_PLAN auto or hier_auto) and keeps tables under "
                     "DP_SHARDING_THRESHOLD data parallel"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("logs", nargs="+", type=Path)
    args = parser.parse_args()
    groups: dict[Path, list[Path]] = {}
    for p in args.logs:
        groups.setdefault(p.parent, []).append(p)
    cases = [case(sorted(ps), args.release, args.commit) for ps in groups.values()]
    # no anchors (outputs of several releases are concatenated), lists of numbers on one line
    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    Dumper.add_representer(list, lambda d, v: d.represent_sequence(
        "tag:yaml.org,2002:seq", v, flow_style=all(isinstance(x, (int, float)) for x in v)))
    yaml.dump(cases, sys.stdout, Dumper=Dumper, sort_keys=False, width=120)


if __name__ == "__main__":
    main()
