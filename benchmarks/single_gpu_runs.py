"""Measure whole training steps and generations of Hugging Face Transformers models on one GPU.

The models are built from their public configs (random weights, nothing downloaded) and run as a
user's own loop runs them: eager modules, PyTorch's SDPA attention, AdamW (PyTorch's default
foreach implementation), either fp32 weights under bf16 autocast ("mixed", what Trainer's
bf16=True does) or bf16 weights and optimizer state ("bf16"). Each run records the median step
time over timed steps after warm-up, the peak memory PyTorch allocated, and the GPU kernels of one
profiled step by name. --cases turns what it wrote into validation cases (SCHEMA.md), as
tests/data/h100-sxm-single-gpu/cases.yaml holds them.

    python benchmarks/single_gpu_runs.py --out OUT [--quick] [--budget-s 360] [--only ID,...]
    python benchmarks/single_gpu_runs.py --out OUT --host     # the host's dispatch per layer
    python benchmarks/single_gpu_runs.py --cases OUT/single_gpu_runs.json --cluster dgx-h100 > cases.yaml

--quick runs tiny models on whatever device is there (the CPU in tests of the script itself).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

#: public configs (config.json of each Hugging Face model card), the fields a timing depends on
CONFIGS = {
    # openai-community/gpt2 and gpt2-medium
    "gpt2": dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
    "gpt2-medium": dict(model_type="gpt2", n_layer=24, n_embd=1024, n_head=16, vocab_size=50257,
                        n_positions=1024),
    # GPT-2 with its vocabulary padded to a multiple of 64, as nanoGPT pads it (model.py: 50304)
    "gpt2-padded": dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12, vocab_size=50304, n_positions=1024),
    # GPT-2 padded, with PyTorch's exact GELU (one kernel) for its gelu_new and no dropout: what a
    # "gelu" FFN says
    "gpt2-plain": dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12, vocab_size=50304, n_positions=1024,
                       activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    # Qwen/Qwen2.5-1.5B
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=32768),
    # Qwen/Qwen2.5-0.5B
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=32768),
    # meta-llama/Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B
    "llama3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                        tie_word_embeddings=True, rope_theta=500000.0, max_position_embeddings=131072),
    "llama3.2-3b": dict(model_type="llama", hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                        num_attention_heads=24, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                        tie_word_embeddings=True, rope_theta=500000.0, max_position_embeddings=131072),
    "llama3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                        tie_word_embeddings=False, rope_theta=500000.0, max_position_embeddings=131072),
    # a tiny Llama for --quick
    "tiny-llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
}

#: the runs, most wanted first: a training step (micro_batch sequences of seq_len tokens, accum
#: micro-batches per optimizer step) or a generation (batch prompts of prompt_len, output_len
#: tokens each)
RUNS = [
    dict(id="llama3.2-1b_mixed_mb4_s2048", model="llama3.2-1b", precision="mixed", micro_batch=4, seq_len=2048),
    dict(id="llama3.2-1b_bf16_mb4_s2048", model="llama3.2-1b", precision="bf16", micro_batch=4, seq_len=2048),
    dict(id="llama3.2-1b_mixed_mb1_s2048", model="llama3.2-1b", precision="mixed", micro_batch=1, seq_len=2048),
    dict(id="llama3.2-1b_mixed_mb4_s2048_accum4", model="llama3.2-1b", precision="mixed", micro_batch=4,
         seq_len=2048, accum=4),
    dict(id="qwen2.5-0.5b_mixed_mb4_s2048", model="qwen2.5-0.5b", precision="mixed", micro_batch=4, seq_len=2048),
    dict(id="gpt2_mixed_mb16_s1024", model="gpt2", precision="mixed", micro_batch=16, seq_len=1024),
    dict(id="gpt2-padded_mixed_mb16_s1024", model="gpt2-padded", precision="mixed", micro_batch=16, seq_len=1024),
    dict(id="gpt2-medium_mixed_mb8_s1024", model="gpt2-medium", precision="mixed", micro_batch=8, seq_len=1024),
    dict(id="llama3.2-3b_bf16_mb2_s2048", model="llama3.2-3b", precision="bf16", micro_batch=2, seq_len=2048),
    dict(id="llama3.2-3b_mixed_mb4_s2048_ckpt", model="llama3.2-3b", precision="mixed", micro_batch=4,
         seq_len=2048, checkpointing=True),
    dict(id="llama3.2-1b_mixed_mb1_s8192", model="llama3.2-1b", precision="mixed", micro_batch=1, seq_len=8192),
    dict(id="gpt2-plain_mixed_mb16_s1024", model="gpt2-plain", precision="mixed", micro_batch=16, seq_len=1024),
    dict(id="qwen2.5-1.5b_mixed_mb4_s2048", model="qwen2.5-1.5b", precision="mixed", micro_batch=4, seq_len=2048),
    dict(id="llama3.2-1b_mixed_mb2_s4096", model="llama3.2-1b", precision="mixed", micro_batch=2, seq_len=4096),
    dict(id="llama3.1-8b_bf16_mb1_s4096_ckpt", model="llama3.1-8b", precision="bf16", micro_batch=1, seq_len=4096,
         checkpointing=True),
    dict(id="llama3.1-8b_generate_b1_p512_o128", model="llama3.1-8b", generate=True, batch=1, prompt_len=512,
         output_len=128),
    dict(id="llama3.1-8b_generate_b16_p512_o128", model="llama3.1-8b", generate=True, batch=16, prompt_len=512,
         output_len=128),
]

QUICK_RUNS = [
    dict(id="tiny_mixed", model="tiny-llama", precision="mixed", micro_batch=2, seq_len=32),
    dict(id="tiny_bf16_accum2", model="tiny-llama", precision="bf16", micro_batch=2, seq_len=32, accum=2),
    dict(id="tiny_generate", model="tiny-llama", generate=True, batch=2, prompt_len=16, output_len=4),
]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _build(run, device, layers=None):
    """The run's model on ``device`` from its config (with ``layers`` decoder layers if given)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = dict(CONFIGS[run["model"]])
    if layers is not None:
        raw["n_layer" if raw["model_type"] == "gpt2" else "num_hidden_layers"] = layers
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    dtype = torch.float32 if run.get("precision") == "mixed" else torch.bfloat16
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.to(device), config


def _kernels(profiler):
    """GPU kernel time of the profiled step by kernel name: {name: [calls, microseconds]}."""
    out = {}
    for event in profiler.key_averages():
        us = getattr(event, "self_device_time_total", 0) or 0
        if us > 0 and str(getattr(event, "device_type", "")).endswith("CUDA"):
            out[event.key] = [event.count, round(us, 1)]
    return out


def _profiled(step, device):
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            _sync(device)
        return _kernels(prof)
    except Exception as err:  # the profile is an extra: a failed one keeps the run's times
        return {"error": repr(err)[:300]}


def _time(step, device, warmup, timed):
    for _ in range(warmup):
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(timed):
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def train_run(run, device, warmup, timed):
    model, config = _build(run, device)
    if run.get("checkpointing"):
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    accum = run.get("accum", 1)
    tokens = torch.randint(0, config.vocab_size, (run["micro_batch"], run["seq_len"]), device=device)
    autocast = run["precision"] == "mixed"

    def step():
        for _ in range(accum):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=tokens, labels=tokens).loss / accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = _time(step, device, warmup, timed)
    result = dict(step_times_s=times, step_time_s=statistics.median(times))
    if device.type == "cuda":
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    result["kernels"] = _profiled(step, device)
    result["params"] = sum(p.numel() for p in model.parameters())
    return result


def generate_run(run, device, warmup, timed):
    model, config = _build(run, device)
    model.eval()
    model.generation_config.eos_token_id = None
    prompt = torch.randint(0, config.vocab_size, (run["batch"], run["prompt_len"]), device=device)
    out_len = run["output_len"]

    @torch.no_grad()
    def generate():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=out_len,
                       min_new_tokens=out_len, do_sample=False, pad_token_id=0)

    @torch.no_grad()
    def prefill():
        model(input_ids=prompt, use_cache=True)

    assert generate().shape[1] == run["prompt_len"] + out_len
    times = _time(generate, device, warmup=0, timed=max(1, timed // 2))
    prefill_times = _time(prefill, device, warmup, timed)
    result = dict(step_times_s=times, step_time_s=statistics.median(times),
                  prefill_s=statistics.median(prefill_times))
    if device.type == "cuda":
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    result["params"] = sum(p.numel() for p in model.parameters())
    return result


def host_run(model_name, device, layers=None, reps=20):
    """What the host takes to issue one training step of a model at a size whose kernels take
    next to nothing (one sequence of 32 tokens): the median forward, backward and optimizer step,
    each timed to a synchronize. Run at two depths, the difference is a decoder layer's."""
    model, config = _build(dict(model=model_name, precision="mixed"), device, layers)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, config.vocab_size, (1, 32), device=device)
    times = {"forward_s": [], "backward_s": [], "optimizer_s": []}
    for i in range(reps + 3):
        marks = [time.perf_counter()]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        _sync(device)
        marks.append(time.perf_counter())
        loss.backward()
        _sync(device)
        marks.append(time.perf_counter())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        marks.append(time.perf_counter())
        if i >= 3:
            for key, a, b in zip(times, marks, marks[1:]):
                times[key].append(b - a)
    return {key: statistics.median(v) for key, v in times.items()}


def schema_model(name: str) -> dict:
    """A CONFIGS entry in the validation schema's model fields."""
    c = CONFIGS[name]
    if c["model_type"] == "gpt2":  # a GELU MLP of 4h, tied embeddings (GPT2LMHeadModel); GPT2Config's
        # activation_function defaults to gelu_new
        return dict(name=name, arch="dense", num_layers=c["n_layer"], hidden_size=c["n_embd"],
                    num_attention_heads=c["n_head"], num_kv_heads=c["n_head"], ffn_hidden_size=4 * c["n_embd"],
                    ffn_type="gelu", activation_function=c.get("activation_function", "gelu_new"),
                    vocab_size=c["vocab_size"], tied_embeddings=True)
    model = dict(name=name, arch="dense", num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"],
                 num_attention_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"],
                 ffn_hidden_size=c["intermediate_size"], ffn_type="swiglu", vocab_size=c["vocab_size"],
                 tied_embeddings=c["tie_word_embeddings"])
    if "head_dim" in c:
        model["head_dim"] = c["head_dim"]
    return model


def cases(results: dict, cluster: str, group: str) -> list[dict]:
    """Validation cases (SCHEMA.md) of the training runs in what main() wrote: the runs' "mixed"
    is bf16 autocast over fp32 weights (the schema's bf16), their "bf16" bf16 weights and state
    (bf16-true); the peak memory PyTorch allocated rides along as an extra key."""
    out = []
    for run in results["runs"]:
        if run.get("generate") or "step_time_s" not in run:
            continue
        accum = run.get("accum", 1)
        measured = {"step_time_s": round(run["step_time_s"], 5)}
        if "peak_allocated_gib" in run:
            measured["peak_allocated_gib"] = round(run["peak_allocated_gib"], 2)
        out.append(dict(
            id=run["id"], group=group,
            source=f"measured by benchmarks/single_gpu_runs.py on one {results['device']}, {results['date']}: "
                   f"Hugging Face Transformers {results['transformers']} from the model's config, PyTorch "
                   f"{results['torch']}, SDPA attention, torch.optim.AdamW defaults; median of {len(run['step_times_s'])} steps",
            model=schema_model(run["model"]),
            hardware=dict(cluster=cluster, num_devices=1),
            parallelism=dict(tp=1, pp=1, dp=1, cp=1, ep=1, zero_stage=0,
                             activation_recompute="full" if run.get("checkpointing") else "none"),
            batch=dict(global_batch_sequences=run["micro_batch"] * accum, micro_batch_size=run["micro_batch"],
                       seq_len=run["seq_len"]),
            precision="bf16-true" if run["precision"] == "bf16" else "bf16",
            framework="huggingface",
            measured=measured,
            target_basis="measured step time (forward, backward and optimizer step of every micro-batch, synchronized)"))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cases", type=Path, help="print validation cases of the runs in this JSON file")
    parser.add_argument("--cluster", default="dgx-h100", help="with --cases: the catalog cluster they ran on")
    parser.add_argument("--group", default="h100_single_gpu", help="with --cases: their group")
    parser.add_argument("--quick", action="store_true", help="tiny models, for a test of the script")
    parser.add_argument("--budget-s", type=float, default=360.0, help="start no run after this many seconds")
    parser.add_argument("--only", default="", help="comma-separated run ids")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timed", type=int, default=4)
    parser.add_argument("--host", action="store_true",
                        help="time the host's dispatch of each model at 32 tokens, whole and at 2 layers")
    args = parser.parse_args(argv)
    if args.cases:
        import yaml

        print(yaml.safe_dump(cases(json.loads(args.cases.read_text()), args.cluster, args.group),
                             sort_keys=False, width=120), end="")
        return 0
    if args.out is None:
        parser.error("--out is required to measure")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runs = QUICK_RUNS if args.quick else RUNS
    if args.only:
        wanted = set(args.only.split(","))
        runs = [r for r in runs if r["id"] in wanted]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "single_gpu_runs.json"
    import transformers

    header = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                  torch=torch.__version__, transformers=transformers.__version__,
                  date=time.strftime("%Y-%m-%d"), configs=CONFIGS)
    if args.host:
        names = ["tiny-llama"] if args.quick else ["llama3.2-1b", "qwen2.5-0.5b", "gpt2", "llama3.2-3b"]
        host = {}
        for name in names:
            raw = CONFIGS[name]
            depth = raw.get("n_layer", raw.get("num_hidden_layers"))
            host[name] = dict(layers=depth, whole=host_run(name, device), two_layers=host_run(name, device, layers=2))
            print(name, host[name], flush=True)
            gc.collect()
        (args.out / "host_dispatch.json").write_text(json.dumps(dict(header, host=host), indent=1))
        return 0
    results = []
    began = time.perf_counter()
    for run in runs:
        if time.perf_counter() - began > args.budget_s:
            results.append(dict(run, skipped="out of budget"))
            continue
        print(f"{run['id']} ...", flush=True)
        try:
            measure = generate_run if run.get("generate") else train_run
            result = measure(run, device, args.warmup, args.timed)
            print(f"  {result['step_time_s']:.4f} s, peak {result.get('peak_allocated_gib', 0):.1f} GiB",
                  flush=True)
            results.append(dict(run, **result))
        except Exception as err:  # out of memory, say: the other runs go on
            results.append(dict(run, failed=repr(err)[:300]))
            print(f"  failed: {err!r}"[:300], flush=True)
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        path.write_text(json.dumps(dict(header, runs=results), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
