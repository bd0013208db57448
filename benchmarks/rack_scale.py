"""The rack-scale energy/latency study reproduced (shared/papers/rack-scale-energy-latency.txt).

Its workloads are Llama-3-8B's FFN block and attention block (d_model 4096, sequence 2048,
batch 16; its Sec. III and IV-A), each run as one training step (forward and backward) under
data parallelism (DP), tensor parallelism (TP: each GPU reads the whole input activation,
all-gather in and reduce-scatter out, i.e. sequence parallel) and pipeline plus tensor
parallelism (PP+TP: each einsum on its own stage, TP within it), on its system (catalog cluster
``rack-scale-study``: NVLink 900 GB/s at 1.3 pJ/bit inside a node of 8, NDR 400 at 50 GB/s and
20 pJ/bit between nodes, peak bandwidth, no startup latency). Then its sweep of compute units
per GPU on 4 GPUs (its "block size", Sec. IV-B): the device scaled with
``meshplan.with_compute_units``.

What differs from the study, and why:

- GPU counts: the study's {4, 6, 8, 10, 16, 32}; meshplan keeps only the counts whose degrees
  divide the work (tp must divide the 32 heads and the FFN width 14336, dp the batch of 16):
  {4, 8, 16, 32}. DP on more GPUs than the batch has sequences is not a plan (it is rejected):
  the study's DP "provides no additional parallelism beyond" 16, so its latency at 32 is the
  one at 16 (the extra GPUs idle, and they draw idle power).
- PP+TP on the FFN: two stages (up with the gate, then down) of tp 2, 4, 8 and 16 GPUs. On the
  attention block meshplan has three einsums, not the study's six (Q, K and V are one fused
  GEMM, the scores and the context one flash-attention core): three stages of 4, 8 and 16 give
  the study's 12, 24 and 48 GPUs. The batch goes through the pipeline one sequence at a time
  (16 micro-batches, 1F1B).
- Latency is the step's compute time (the critical device's compute, bubble included), as the
  study's latency figures (2 to 5) are compute latency and its communication latency is apart
  (Fig. 11); the step time with communication exposed is printed beside it.
- The study models no optimizer step; every plan here uses the distributed optimizer (ZeRO-1),
  so each weight is updated once whatever the plan, and the optimizer's memory traffic is the
  same for all plans. The FP32 gradient all-reduce the study models for DP is kept.

Run: ``python benchmarks/rack_scale.py`` (prints the tables; about a second).
"""

from __future__ import annotations

from dataclasses import dataclass

import meshplan
from meshplan import catalog

CLUSTER = "rack-scale-study"
BATCH = 16  # sequences (the study: "the batch size is limited to 16")
SEQ_LEN = 2048  # the study's S
GPU_COUNTS = (4, 8, 16, 32)
PP_TP = {"mlp": ((2, 2), (2, 4), (2, 8), (2, 16)), "attention": ((3, 4), (3, 8), (3, 16))}  # (pp, tp)
COMPUTE_UNITS = (64, 128, 256, 512, 1024)  # the study's block sizes, as SMs per GPU
SWEEP_GPUS = 4


def block_model(block: str) -> dict:
    """Llama-3-8B's FFN (``mlp``) or attention block, alone, at the study's sequence length."""
    base = catalog.model("llama3-8b").model_dump()
    return {**base, "id": f"llama3-8b-{block}", "name": f"Llama 3 8B {block} block", "num_layers": 1,
            "block": block, "seq_len": SEQ_LEN}


@dataclass(frozen=True)
class Row:
    block: str
    parallelism: str  # dp, tp, pp+tp
    gpus: int
    sm_count: int
    compute_s: float  # the critical device's compute, bubble included
    step_s: float
    energy: dict  # EnergyBreakdown.as_dict()

    @property
    def links_j(self) -> dict[str, float]:
        return self.energy["links_j"]


def plan(parallelism: str, gpus: int, pp: int = 1) -> dict:
    tp = {"dp": 1, "tp": gpus, "pp+tp": gpus // pp}[parallelism]
    dp = gpus // (tp * pp)
    return {"tp": tp, "pp": pp, "global_batch_size": BATCH, "micro_batch_size": 1 if pp > 1 else BATCH // dp,
            "sequence_parallel": tp > 1, "zero_stage": 1, "recompute": "none"}


def run(block: str, parallelism: str, gpus: int, pp: int = 1, cluster=CLUSTER, sm_count: int | None = None) -> Row:
    e = meshplan.estimate(block_model(block), cluster, num_devices=gpus, **plan(parallelism, gpus, pp))
    device = e.energy  # every catalog H100 profile has a power model
    sms = sm_count or catalog.cluster(CLUSTER).device.sm_count
    return Row(block, parallelism, gpus, sms, e.breakdown.compute_s + e.breakdown.bubble_s, e.step_time_s, device.as_dict())


def gpu_sweep(block: str) -> list[Row]:
    """DP and TP on 4 to 32 GPUs (DP up to the batch), PP+TP on the study's stage sizes."""
    rows = [run(block, "tp", n) for n in GPU_COUNTS]
    rows += [run(block, "dp", n) for n in GPU_COUNTS if n <= BATCH]
    rows += [run(block, "pp+tp", pp * tp, pp) for pp, tp in PP_TP[block]]
    return rows


def compute_unit_sweep(block: str) -> list[Row]:
    """4 GPUs of each compute-unit count, under DP, TP and PP+TP (the FFN's 2 x 2; the attention
    block's three stages need at least 12 GPUs, so it has no PP+TP point at 4)."""
    rows = []
    for sms in COMPUTE_UNITS:
        cluster = meshplan.with_compute_units(CLUSTER, sms)
        rows.append(run(block, "dp", SWEEP_GPUS, cluster=cluster, sm_count=sms))
        rows.append(run(block, "tp", SWEEP_GPUS, cluster=cluster, sm_count=sms))
        if block == "mlp":
            rows.append(run(block, "pp+tp", SWEEP_GPUS, 2, cluster=cluster, sm_count=sms))
    return rows


def table(rows: list[Row], title: str) -> str:
    levels = sorted({name for r in rows for name in r.links_j})
    head = f"{'block':9} {'par':6} {'gpus':>4} {'SMs':>5} {'compute ms':>10} {'step ms':>8} {'compute J':>9} " \
           f"{'memory J':>8} {'static J':>8} " + " ".join(f"{name + ' J':>10}" for name in levels) + f" {'total J':>8}"
    lines = [title, head]
    for r in rows:
        e = r.energy
        links = " ".join(f"{r.links_j.get(name, 0.0):10.3f}" for name in levels)
        lines.append(f"{r.block:9} {r.parallelism:6} {r.gpus:4d} {r.sm_count:5d} {r.compute_s * 1e3:10.2f} {r.step_s * 1e3:8.2f} "
                     f"{e['compute_j']:9.2f} {e['memory_j']:8.2f} {e['static_j']:8.2f} {links} {e['total_j']:8.2f}")
    return "\n".join(lines)


def main() -> None:
    for block in ("mlp", "attention"):
        print(table(gpu_sweep(block), f"\nGPU sweep, {block} block (Llama-3-8B, batch {BATCH} x {SEQ_LEN} tokens, one training step)"))
    for block in ("mlp", "attention"):
        print(table(compute_unit_sweep(block), f"\nCompute units per GPU, {block} block, {SWEEP_GPUS} GPUs"))


if __name__ == "__main__":
    main()
