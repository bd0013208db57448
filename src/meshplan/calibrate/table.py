"""Measured rows as CSV files written one row at a time, so an interrupted run resumes.

A rerun with the same ``--out`` reads the rows already there and measures only the missing
ones. A row is keyed by its leading (input) columns; a last line cut short by a crash is
dropped, so it is measured again.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from meshplan.errors import MeshplanError

#: the columns of each file, as in ../shared/calibration/h100-sxm/ (README.md there)
COLUMNS = {
    "gemm_bf16.csv": ("model", "tp", "tokens", "gemm", "pass", "m", "n", "k", "time_s", "tflops"),
    "gemm_fp8.csv": ("model", "tp", "tokens", "gemm", "pass", "m", "n", "k", "time_s", "tflops"),
    "attention.csv": ("heads", "kv_heads", "head_dim", "batch", "seq", "causal",
                      "fwd_s", "fwd_bwd_s", "fwd_flop", "fwd_tflops", "bwd_tflops"),
    "memory_ops.csv": ("op", "elements", "dtype", "bytes_moved", "time_s", "gbps"),
    "layer.csv": ("model", "tp", "micro_batch", "seq", "fwd_s", "fwd_bwd_s", "layer_params", "fwd_flop_gemm", "fwd_flop_attn",
                  "model_tflops_fwd_bwd", "peak_mem_gib"),
    "collectives.csv": ("collective", "ranks", "nodes", "bytes", "time_s", "algbw", "busbw"),
    "overlap.csv": ("on", "ranks", "nodes", "bytes", "gemm", "gemm_alone_s", "gemm_beside_s", "collective_s", "covered",
                    "slowdown"),
    "power.csv": ("workload", "seconds", "calls", "energy_j", "avg_power_w", "sampled_power_w_median", "sm_mhz_median",
                  "flop", "bytes", "tflop_per_s", "gb_per_s"),
}

#: how many leading columns name a row (the rest are what was measured)
KEY_COLUMNS = {"gemm_bf16.csv": 8, "gemm_fp8.csv": 8, "attention.csv": 6, "memory_ops.csv": 3, "layer.csv": 4, "collectives.csv": 4,
               "overlap.csv": 5, "power.csv": 1}


class Table:
    """One CSV file of measured rows, appended to and flushed row by row."""

    def __init__(self, folder: Path, name: str):
        self.path = Path(folder) / name
        self.columns = COLUMNS[name]
        self._key_len = KEY_COLUMNS[name]
        self.done: set[tuple[str, ...]] = set()
        if self.path.exists():
            self._resume()
        else:
            self.path.write_text(",".join(self.columns) + "\n")

    def _resume(self) -> None:
        text = self.path.read_text()
        lines = text.splitlines()
        if not lines or tuple(lines[0].split(",")) != self.columns:
            raise MeshplanError(str(self.path), lines[0] if lines else "", f"a calibration file with the columns {','.join(self.columns)} (use another --out)")
        complete = lines if text.endswith("\n") else lines[:-1]  # a row cut short is measured again
        rows = [r for r in csv.reader(complete[1:]) if len(r) == len(self.columns)]
        self.done = {tuple(r[: self._key_len]) for r in rows}
        body = io.StringIO()
        csv.writer(body, lineterminator="\n").writerows([self.columns, *rows])
        self.path.write_text(body.getvalue())

    def has(self, key: tuple) -> bool:
        return tuple(str(k) for k in key) in self.done

    def append(self, values: tuple) -> None:
        if len(values) != len(self.columns):
            raise ValueError(f"{self.path.name}: {len(values)} values for {len(self.columns)} columns")
        row = [_cell(v) for v in values]
        with self.path.open("a", newline="") as f:
            csv.writer(f, lineterminator="\n").writerow(row)
            f.flush()
        self.done.add(tuple(row[: self._key_len]))


def _cell(value) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6e}"
    return str(value)


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a calibration CSV as mappings of column to text (empty if the file is absent)."""
    if not Path(path).exists():
        return []
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))
