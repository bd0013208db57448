"""Turn Megatron-Bridge's published performance tables into validation cases.

    python benchmarks/import_bridge_tables.py MB/docs/performance-summary.md \
        MB/docs/performance-summary-archive.md --models ../shared/validation/public-cases.yaml \
        --commit 067f987d > benchmarks/data/megatron_bridge_tables.yaml

MB is a checkout of NVIDIA-NeMo/Megatron-Bridge. Every table row whose model, system and precision
meshplan can express becomes one case (shared/validation/SCHEMA.md), measured step time =
GBS x sequence length / (tokens/s/GPU x GPUs). Model dimensions are the public cases' blocks of
the same model (public HF configs), found by name. What is skipped: systems with no catalog
cluster (DGX-B300), hybrid Mamba models (Nemotron 3), Kimi K2 (Muon optimizer), token-dropping
runs (capacity factors are not modelled), tables without a precision column (25.09) and the
SFT and LoRA tables (the case format has no task).
Where a cell holds an alternative in parentheses ("FP8-CS (FP8-MX)", "3986 (3546)"), the first
value is the row's. The switches a release's recipe set beyond megatron-core's preset (the expert
dispatcher and its overlap, Adam's moments, activation offload, CUDA graphs) are not written
here: meshplan validate takes them from catalog/recipes.yaml for every case whose source names
Megatron-Bridge and its container (meshplan.io.recipes).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

#: table model name prefix -> the public cases' model name
MODELS = {
    "LLAMA3_8B": "Llama 3 8B",
    "LLAMA3_70B": "Llama 3 70B",
    "LLAMA3.1_405B": "Llama 3.1 405B",
    "DeepSeekV3": "DeepSeek-V3",
    "GPT OSS 120B": "gpt-oss-120b",
    "Qwen3_30B_a3B": "Qwen3-30B-A3B",
    "Qwen3_235B_a22B": "Qwen3-235B-A22B",
}

#: table system -> (catalog cluster, GPUs per node)
SYSTEMS = {
    "DGX-H100": ("dgx-h100", 8),
    "DGX-B200": ("dgx-b200", 8),
    "DGX-GB200": ("gb200-nvl72", 4),
    "DGX-GB300": ("gb300-nvl72", 4),
}

#: table precisions meshplan runs, as the case's precision word (meshplan.io.case_inputs reads
#: FP8-CS, FP8-DS, FP8-MX, MXFP8 and NVFP4 as FP8 or FP4 with their scaling recipe)
PRECISIONS = {"BF16", "FP8", "FP8-CS", "FP8-DS", "FP8-MX", "MXFP8", "NVFP4"}


def first(cell: str) -> str:
    """The row's own value of a cell that may add an alternative in parentheses."""
    return cell.split("(")[0].strip()


def degree(cell: str) -> int:
    """A parallel degree; "n/a" (not used) is 1."""
    value = first(cell)
    return 1 if value in ("n/a", "") else int(value)


def table_rows(text: str):
    """(container, section, row as {column: cell}) for every row of every table; a table is
    titled by a '#### Model:' or '#### System:' heading whose value fills the missing column."""
    container = section = title = None
    header: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## ") and "Container" in line:
            container = line[3:].replace("NeMo Container", "").strip()
        elif line.startswith("### "):
            section = line[4:].strip()
        elif line.startswith("#### "):
            title = line[5:].split(":", 1)
            header = None
        elif line.startswith("|--"):
            continue
        elif line.startswith("|"):
            cells = [re.sub(r"\[\^[^]]*\]", "", c).strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
                continue
            row = dict(zip(header, cells))
            if title is not None and len(title) == 2:
                row.setdefault(title[0].strip(), title[1].strip())
            yield container, section, row
        else:
            header = None


def case(container: str, row: dict, models: dict, commit: str) -> dict | None:
    """One validation case, or None where the row is outside what meshplan models."""
    name = next((v for k, v in MODELS.items() if row.get("Model", "").startswith(k)), None)
    if name is None or "tokendrop" in row["Model"] or row.get("System") not in SYSTEMS or "Precision" not in row:
        return None
    if first(row["Precision"]) not in PRECISIONS:
        return None
    precision = first(row["Precision"]).lower()
    cluster, per_node = SYSTEMS[row["System"]]
    gpus, tp, pp, cp = (int(first(row[k])) for k in ("#-GPUs", "TP", "PP", "CP"))
    vp, ep = degree(row["VP"]), degree(row["EP"])
    fsdp = int(first(row.get("FSDP", "0")) or 0)
    gbs, mbs, seq = (int(first(row[k])) for k in ("GBS", "MBS", "Sequence Length"))
    tokens = float(first(row["Tokens / sec / GPU"]).replace(",", ""))
    model = models[name]
    inferred = ["dp = gpus/(tp*pp*cp) (EP nested inside DP for MoE)",
                "sequence parallel with TP and the distributed optimizer are Megatron-Bridge recipe defaults, not in the table",
                "model dims from public HF configs (the public cases' block of the same model), not from the table"]
    if fsdp:
        inferred.append(f"FSDP {fsdp}: Megatron-FSDP full sharding, zero_stage 3")
    if "MTP" in row["Model"] and "w/o" not in row["Model"]:
        inferred.append("multi-token prediction layer not modelled")
    system = row["System"].removeprefix("DGX-").lower()
    parallelism = {"tp": tp, "pp": pp, "cp": cp, "dp": gpus // (tp * pp * cp), "ep": ep, "sequence_parallel": tp > 1,
                   "virtual_pipeline_stages": vp, "zero_stage": 3 if fsdp else 1, "activation_recompute": "none"}
    return {
        "id": re.sub(r"[^a-z0-9_.]+", "_", f"mbt_{container}_{system}_{name}_{gpus}gpu_{row['Precision']}_tp{tp}pp{pp}cp{cp}vp{vp}ep{ep}mbs{mbs}".lower()).strip("_"),
        "group": f"mbridge_tables_{system}_{model['arch']}",
        "source": f"NVIDIA Megatron-Bridge docs/performance-summary*.md (commit {commit}), NeMo container {container}",
        "framework": "megatron-core",
        "model": model,
        "hardware": {"cluster": cluster, "num_devices": gpus, "devices_per_node": per_node},
        "parallelism": parallelism,
        "batch": {"global_batch_sequences": gbs, "micro_batch_size": mbs, "seq_len": seq},
        "precision": precision,
        "measured": {"step_time_s": round(gbs * seq / (tokens * gpus), 6), "tokens_per_s_per_gpu": tokens},
        "target_basis": "tokens/s/GPU -> step time",
        "inferred": inferred,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", type=Path, help="Megatron-Bridge performance-summary markdown files")
    parser.add_argument("--models", type=Path, required=True, help="validation cases whose model blocks give the dimensions")
    parser.add_argument("--commit", required=True, help="the Megatron-Bridge commit the tables were read at")
    args = parser.parse_args()
    models = {c["model"]["name"]: c["model"] for c in yaml.safe_load(args.models.read_text()) if isinstance(c["model"], dict) and "name" in c["model"]}
    cases, seen = [], set()
    for path in args.tables:
        for container, section, row in table_rows(path.read_text()):
            if section != "Pre-Training Performance":  # SFT and LoRA runs: tasks the case format lacks
                continue
            c = case(container, row, models, args.commit)
            if c is not None and c["id"] not in seen:
                seen.add(c["id"])
                cases.append(c)
    print(f"# {len(cases)} cases generated by benchmarks/import_bridge_tables.py; do not edit by hand")
    yaml.safe_dump(cases, sys.stdout, sort_keys=False, width=120)


if __name__ == "__main__":
    main()
