"""Turn the performance tables of NVIDIA's DGX Cloud benchmarking recipes into validation cases.

    git -C DGXC show 35a9aec:llama3.1/README_8b.md > /tmp/llama8b.md   # and the others below
    python benchmarks/import_dgxc_tables.py --commit 35a9aec \
        --models ../shared/validation/public-cases.yaml README_*.md > tests/data/dgxc_h100.yaml

DGXC is a checkout of NVIDIA/dgxc-benchmarking. Release v24.11.1 (commit 35a9aec) publishes, per
recipe README, tables of measured training step time on 8 to 2304 H100s of NVIDIA's DGX H100
reference architecture, BF16 and FP8: Llama 3.1 8B, 70B and 405B (llama3.1/README_{8b,70b,405b}.md),
Nemotron-4 15B and 340B (nemotron/README_{15b,340b}.md) and GPT-3 175B (nemo_megatron/README_175b.md),
all run by the NeMo 24.09 container's NeMo launcher. A table's header names the plan ("TP=4, PP=4,
CP=2, VP=5, MBS=1, GA=64") and each column its GPU count and global batch; the 405B table gives
layers, global batch, PP and VP per column (its small scales are proxies with fewer layers). Every
column becomes one case: measured step time = the table's "Training step time (seconds per step)";
DP = GPUs / (TP x PP x CP), checked against the gradient accumulation the header states. Model
dimensions are the public cases' blocks of the same model, found by name; the sequence length is the
one each README's throughput example uses. Tables of the other recipes (Grok-1, and PaxML, MaxText
and Hugging Face runs whose plans the tables do not state) are skipped.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

#: table model name prefix -> (the case id's name, the public cases' model name (Llama 3.1 8B and
#: 70B are Llama 3's architecture), sequence length)
MODELS = {
    "Llama 3.1 8b": ("llama3.1_8b", "Llama 3 8B", 8192),
    "Llama 3.1 70b": ("llama3.1_70b", "Llama 3 70B", 8192),
    "Llama 3.1 405b": ("llama3.1_405b", "Llama 3.1 405B", 8192),
    "Nemotron4 15b": ("nemotron4_15b", "Nemotron-4 15B", 4096),
    "Nemotron4 340b": ("nemotron4_340b", "Nemotron-4 340B", 4096),
    "NeMo Megatron": ("gpt3_175b", "GPT-3 175B", 2048),
}

#: models the public cases do not hold: Nemotron-4 15B (Parmar et al. 2024, "Nemotron-4 15B
#: Technical Report", Table 1: 32 layers, hidden 6144, 48 heads, 8 KV heads, squared ReLU, 256K
#: vocabulary, untied embeddings; FFN 4 x hidden) and GPT-3 175B (Brown et al. 2020, Table 2.1;
#: NeMo's GPT-3 configs pad GPT-2's 50257-token vocabulary to 51200)
EXTRA_MODELS = {
    "Nemotron-4 15B": {"name": "Nemotron-4 15B", "arch": "dense", "num_layers": 32, "hidden_size": 6144,
                       "num_attention_heads": 48, "num_kv_heads": 8, "ffn_hidden_size": 24576,
                       "ffn_type": "squared_relu", "vocab_size": 256000},
    "GPT-3 175B": {"name": "GPT-3 175B", "arch": "dense", "num_layers": 96, "hidden_size": 12288,
                   "num_attention_heads": 96, "num_kv_heads": 96, "ffn_hidden_size": 49152,
                   "ffn_type": "gelu", "vocab_size": 51200},
}

HEADER = re.compile(r"^(?P<model>.+?) (?P<container>\d\d\.\d\d) (?P<precision>BF16|FP8) \((?P<plan>[^)]*)\)$")
COLUMN = re.compile(r"(?P<gpus>\d+)x H100 GPUs(?: \(GBS=(?P<gbs>\d+)\))?")


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str):
    """(header cells, {row label: cells}) of each table whose header names a plan."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        head = cells(lines[i]) if lines[i].startswith("|") else []
        if head and HEADER.match(head[0]):
            rows = {}
            i += 1
            while i < len(lines) and lines[i].startswith("|"):
                row = cells(lines[i])
                if not set(row[0]) <= set("-: "):
                    rows[row[0]] = row[1:]
                i += 1
            yield head, rows
        else:
            i += 1


def number(cell: str) -> float:
    """A table number; the 405B table prints one as "8.7  5"."""
    return float(cell.replace(" ", ""))


def cases(text: str, models: dict, commit: str, readme: str) -> list[dict]:
    out = []
    for head, rows in tables(text):
        m = HEADER.match(head[0])
        name = next((k for k in MODELS if m["model"].startswith(k)), None)
        if name is None:
            continue
        slug, model_name, seq = MODELS[name]
        plan = {k: int(v) for k, v in re.findall(r"(TP|PP|CP|VP|MBS|GA)=(\d+)", m["plan"])}
        times = rows["Training step time (seconds per step)"]
        for j, column in enumerate(head[1:]):
            c = COLUMN.search(column)
            if c is None or j >= len(times) or not times[j]:
                continue
            gpus = int(c["gpus"])
            model = dict(models[model_name])
            tp, pp, cp, vp = plan.get("TP", 1), plan.get("PP", 1), plan.get("CP", 1), plan.get("VP", 1)
            gbs = int(c["gbs"]) if c["gbs"] else None
            if "Layers" in rows:  # the 405B table: per-column layers, batch, PP and VP
                model["num_layers"] = int(rows["Layers"][j])
                gbs, pp = int(rows["GBS"][j]), int(rows["PP"][j])
                vp = 1 if rows["VP"][j] == "n/a" else int(rows["VP"][j])
            dp = gpus // (tp * pp * cp)
            mbs = plan.get("MBS", 1)
            if "GA" in plan and gbs != dp * mbs * plan["GA"]:
                raise ValueError(f"{readme}: {head[0]} at {gpus} GPUs: GBS {gbs} != DP {dp} x MBS {mbs} x GA {plan['GA']}")
            precision = m["precision"].lower()
            out.append({
                "id": f"dgxc_{m['container']}_{slug}_{precision}_{gpus}gpu",
                "group": "dgxc_h100",
                "source": f"NVIDIA/dgxc-benchmarking at {commit}, {readme}: '{head[0]}', {column}; "
                          f"https://github.com/NVIDIA/dgxc-benchmarking/blob/{commit}/{readme}",
                "model": model,
                "hardware": {"cluster": "dgx-h100", "num_devices": gpus, "devices_per_node": 8},
                "parallelism": {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": 1, "sequence_parallel": tp > 1,
                                "virtual_pipeline_stages": vp, "zero_stage": 1, "activation_recompute": "none"},
                "batch": {"global_batch_sequences": gbs, "micro_batch_size": mbs, "seq_len": seq},
                "precision": precision,
                "framework": "nemo",
                "measured": {"step_time_s": number(times[j])},
                "target_basis": "measured step time (the table's training step time)",
                "inferred": [
                    "dp = GPUs / (TP x PP x CP)",
                    "sequence parallelism with TP and the distributed optimizer (zero_stage 1): the NeMo launcher's defaults, not in the table",
                    "no activation recompute: the tables name none, and the GPT-3 recipe's config (nemo_megatron/gpt3_175b_hydra.yaml) sets none",
                    f"sequence length {seq}: the README's throughput example",
                    "model dimensions from the public cases' block of the same model (or the model's report), not from the table",
                ],
            })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("readmes", nargs="+", type=Path, help="recipe READMEs, each named as in the repository (dir/README_x.md via --name)")
    parser.add_argument("--models", type=Path, required=True, help="public-cases.yaml, for the model blocks")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--names", nargs="*", default=None, help="each README's path in the repository, in order")
    args = parser.parse_args()
    public = yaml.safe_load(args.models.read_text())
    public = public["cases"] if isinstance(public, dict) else public
    models = {**{c["model"]["name"]: c["model"] for c in public if c["model"].get("name")}, **EXTRA_MODELS}
    names = args.names or [str(p) for p in args.readmes]
    out = []
    for path, name in zip(args.readmes, names):
        out += cases(path.read_text(), models, args.commit, name)
    sys.stdout.write(f"# {len(out)} runs from NVIDIA/dgxc-benchmarking's recipe READMEs at {args.commit} "
                     f"(benchmarks/import_dgxc_tables.py)\n")
    yaml.safe_dump(out, sys.stdout, sort_keys=False, width=120)


if __name__ == "__main__":
    main()
