"""Stored results for the report tests, written by the CLI as users write them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from meshplan.cli import app
from test_validate_cases import GOOD

# Narayanan et al. SC21 Table 1, the 1.7B row (test_validate_cases.GOOD): small and fast
CASE = {**GOOD, "group": "sc21"}

ESTIMATE = ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "1536", "--tp", "8",
            "--pp", "16", "--global-batch", "1536", "--recompute", "full"]
INFERENCE = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "8", "--task", "inference",
             "--batch", "64", "--prompt-len", "2048", "--output-len", "512"]
DLRM = ["estimate", "--model", "dlrm-a", "--cluster", "zionex-a100", "--devices", "128", "--strategy",
        "embedding=(mp) dense=(tp,ddp)", "--global-batch", "65536"]
SEARCH = ["search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "64", "--global-batch", "1536",
          "--executor", "serial", "--set", "space.tp=[4,8]", "--set", "space.pp=[4,8]"]


def _run(args: list[str]) -> str:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.stdout


def cases() -> list[dict]:
    """Five cases in two groups, one of them broken (it is reported, not scored)."""
    out = []
    for i, (group, measured) in enumerate([("sc21", 2.7), ("sc21", 5.9), ("other", 3.2), ("other", 4.9)]):
        c = copy.deepcopy(CASE)
        c.update(id=f"case{i}", group=group)
        c["measured"]["step_time_s"] = measured
        c["batch"]["global_batch_sequences"] = 512 * (1 + i % 2)
        out.append(c)
    out.append({**copy.deepcopy(CASE), "id": "broken", "model": None})
    return out


def write_inputs(folder: Path) -> dict[str, Path]:
    """estimate.json, trace.json, search.json, store/ and validation.json in ``folder``, and a
    serving request's and a DLRM iteration's estimate and trace (inference*.json, dlrm*.json)."""
    names = ("estimate", "trace", "search", "validation", "inference", "inference_trace", "dlrm", "dlrm_trace")
    paths = {name: folder / f"{name}.json" for name in names}
    paths["store"] = folder / "store"
    paths["estimate"].write_text(_run([*ESTIMATE, "--json", "--trace", str(paths["trace"])]))
    paths["inference"].write_text(_run([*INFERENCE, "--json", "--trace", str(paths["inference_trace"])]))
    paths["dlrm"].write_text(_run([*DLRM, "--json", "--trace", str(paths["dlrm_trace"])]))
    paths["search"].write_text(_run([*SEARCH, "--json", "--store", str(paths["store"])]))
    (folder / "cases.yaml").write_text(yaml.safe_dump(cases()))
    paths["validation"].write_text(_run(["validate", str(folder / "cases.yaml"), "--json"]))
    json.loads(paths["validation"].read_text())  # the CLI wrote JSON
    return paths
