"""Turn llm-foundry's published MPT training benchmarks into validation cases.

    git -C FOUNDRY show 8c8dd48f:scripts/train/benchmarking/README.md > foundry.md
    python benchmarks/import_foundry_tables.py foundry.md --commit 8c8dd48f > tests/data/llm_foundry.yaml

FOUNDRY is a checkout of mosaicml/llm-foundry. Every row of the README's tables becomes one case
(shared/validation/SCHEMA.md): measured step time = global batch (tokens) / throughput (tokens/s),
the table's own columns, so no rounding of the sequences-per-second column enters. Model
dimensions are the repository's scripts/train/yamls/pretrain/mpt-<size>.yaml: GELU FFN of 4x,
vocabulary 50368, learned position embeddings and biases (the NumParams column counts both), the
embedding tied to the output layer. FSDP's FULL_SHARD is ZeRO-3, SHARD_GRAD_OP ZeRO-2; its
mixed-precision mode is kept as an extra key. Left out: rows with activation CPU offload (none in
the tables) and rows whose micro-batches do not add up to the global batch (none either).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

#: MPT size -> (layers, d_model, heads), scripts/train/yamls/pretrain/mpt-<size>.yaml
MPT = {
    "125m": (12, 768, 12),
    "350m": (24, 1024, 16),
    "760m": (24, 1536, 12),
    "1b": (24, 2048, 16),
    "3b": (32, 2560, 20),
    "7b": (32, 4096, 32),
    "13b": (40, 5120, 40),
    "30b": (48, 7168, 56),
    "70b": (80, 8192, 64),
}

#: table GPU -> catalog cluster (the tables name 1600 Gb/s RoCE between A100 nodes)
SYSTEMS = {"h100_80gb": "dgx-h100", "a100_80gb": "dgx-a100-80gb", "a100_40gb": "dgx-a100-40gb"}

#: table precision -> plan precision (amp_*: torch autocast over fp32 master weights)
PRECISIONS = {"amp_bf16": "bf16", "bf16": "bf16", "amp_fp8": "fp8"}

#: FSDP sharding strategy -> ZeRO stage (FULL_SHARD shards weights too, SHARD_GRAD_OP keeps them)
SHARDING = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}


def model_block(size: str) -> dict:
    layers, d_model, heads = MPT[size]
    return {
        "name": f"MPT {size}",
        "arch": "dense",
        "num_layers": layers,
        "hidden_size": d_model,
        "num_attention_heads": heads,
        "ffn_hidden_size": 4 * d_model,
        "ffn_type": "gelu",
        "vocab_size": 50368,
    }


def rows(text: str):
    """(section heading, {column: cell}) for every data row of the README's tables."""
    section, header = "", None
    for line in text.splitlines():
        if line.startswith("## "):
            section, header = line[3:].strip(), None
            continue
        if not line.startswith("|"):
            header = None if not line.strip() else header
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("- "):
            yield section, dict(zip(header, cells))


def case(section: str, row: dict, index: int, commit: str) -> dict | None:
    size, gpu = row["Model"], row["GPU"]
    if row["Activation CPUOffload"] != "False" or size not in MPT:
        return None
    gpus, seq = int(row["# GPUs"]), int(row["SeqLen (T)"])
    tokens, tokens_per_s = int(row["GlobalBatchSize (T)"]), float(row["Throughput (T/s)"])
    micro, accum = int(row["MicroBatchSize"]), int(row["GradAccum"])
    batch = int(row["GlobalBatchSize"])
    if batch != micro * accum * gpus:  # Composer would run a short last micro-batch: not this format
        return None
    precision = PRECISIONS[row["Precision"]]
    recompute = "full" if row["Activation Checkpointing"] == "True" else "none"
    return {
        "id": f"foundry_{gpu}_{size}_s{seq}_{gpus}gpu_{precision}_{index}",
        "group": f"llm_foundry_{gpu}",
        "source": (f"llm-foundry scripts/train/benchmarking/README.md at {commit}, section '{section}', "
                   f"row {size} seq {seq} on {gpus} {gpu}; https://github.com/mosaicml/llm-foundry/blob/"
                   f"{commit}/scripts/train/benchmarking/README.md"),
        "model": model_block(size),
        "hardware": {"cluster": SYSTEMS[gpu], "num_devices": gpus, "devices_per_node": 8},
        "parallelism": {
            "tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": gpus,
            "sequence_parallel": False,
            "zero_stage": SHARDING[row["Sharding Strategy"]],
            "activation_recompute": recompute,
            # an extra key: FSDP's mixed_precision, DEFAULT reduces gradients in fp32, PURE in bf16
            "fsdp_mixed_precision": row["MP Mode"],
        },
        "batch": {"global_batch_sequences": batch, "micro_batch_size": micro, "seq_len": seq},
        "precision": precision,
        "framework": "llm-foundry",
        "measured": {
            "step_time_s": round(tokens / tokens_per_s, 6),
            "tokens_per_s_per_gpu": round(tokens_per_s / gpus, 1),
            "mfu": float(row["MFU"]) / 100,
        },
        "target_basis": "global batch (tokens) / throughput (tokens/s)",
        "inferred": [
            "model dimensions from scripts/train/yamls/pretrain/mpt-<size>.yaml",
            f"{accum} micro-batches of {micro} per GPU (GradAccum, MicroBatchSize)",
            "cluster: the catalog DGX of that GPU; the tables name 1600 Gb/s RoCE between A100 nodes",
        ],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("readme", type=Path)
    parser.add_argument("--commit", required=True)
    args = parser.parse_args(argv)
    cases = []
    for index, (section, row) in enumerate(rows(args.readme.read_text())):
        made = case(section, row, index, args.commit)
        if made is not None:
            cases.append(made)
    print(f"# {len(cases)} runs from llm-foundry's MPT training benchmarks (benchmarks/import_foundry_tables.py)")
    yaml.safe_dump(cases, sys.stdout, sort_keys=False, width=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
