"""The command line: the only place that parses arguments or prints."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from meshplan.cli_collective import collective as _collective
from meshplan.cli_errors import is_usage_error, usage_message
from meshplan.cli_query import HELP as _HELP
from meshplan.cli_query import catalog_app, results_app
from meshplan.cli_query import console as _console
from meshplan.errors import MeshplanError


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    context_settings=_HELP,
    pretty_exceptions_enable=False,
    help="Predict and plan how large ML models run on accelerator clusters.",
)
def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"meshplan {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
):
    """Predict and plan how large ML models run on accelerator clusters."""


app.add_typer(catalog_app, name="catalog")
app.add_typer(results_app, name="results")
app.command("collective")(_collective)

_PLAN_FLAGS = {
    "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "global_batch": "global_batch_size",
    "micro_batch": "micro_batch_size", "seq_len": "seq_len", "vpp": "virtual_pipeline_stages",
    "schedule": "schedule", "zero": "zero_stage", "recompute": "recompute", "precision": "precision",
    "sequence_parallel": "sequence_parallel", "strategy": "strategy", "framework": "framework",
    "tp_overlap": "tp_overlap", "ep_overlap": "ep_overlap", "optimizer_offload": "optimizer_offload",
    "activation_offload": "activation_offload_layers", "fusion": "fusion", "recompute_layers": "recompute_layers",
    "fp8_attention": "fp8_attention",
}




@app.command()
def estimate(
    model: Optional[str] = typer.Option(None, help="Catalog model id, or a HuggingFace config.json path."),
    cluster: Optional[str] = typer.Option(None, help="Catalog cluster id."),
    devices: Optional[int] = typer.Option(None, help="Number of devices (default: tp*cp*pp*dp)."),
    tp: Optional[int] = typer.Option(None, help="Tensor-parallel degree."),
    pp: Optional[int] = typer.Option(None, help="Pipeline-parallel degree."),
    dp: Optional[int] = typer.Option(None, help="Data-parallel degree (default: inferred)."),
    cp: Optional[int] = typer.Option(None, help="Context-parallel degree."),
    ep: Optional[int] = typer.Option(None, help="Expert-parallel degree (MoE models; divides cp*dp)."),
    global_batch: Optional[int] = typer.Option(None, help="Sequences per step."),
    micro_batch: Optional[int] = typer.Option(None, help="Sequences per micro-batch."),
    seq_len: Optional[int] = typer.Option(None, help="Tokens per sequence (default: the model's)."),
    vpp: Optional[int] = typer.Option(None, help="Virtual pipeline stages per device (interleaved 1F1B)."),
    schedule: Optional[str] = typer.Option(None, help="Pipeline schedule: 1f1b, gpipe, zb-h1 or dualpipe."),
    framework: Optional[str] = typer.Option(None, help="Overlap defaults of megatron-lm, megatron-core, nemo, nemo-launcher, torchtitan, deepspeed, llm-foundry, pytorch-fsdp or fms-fsdp."),
    tp_overlap: Optional[str] = typer.Option(None, help="Tensor-parallel communication: none, bulk (backward) or pipelined with the GEMMs."),
    ep_overlap: Optional[str] = typer.Option(None, help="Expert all-to-all: none (blocking) or paired (beside another micro-batch's compute)."),
    fusion: Optional[str] = typer.Option(None, help="Norms and rotary embeddings: fused (Transformer Engine, torch.compile) or eager (PyTorch op by op)."),
    zero: Optional[int] = typer.Option(None, help="ZeRO stage 0-3 (3 = FSDP full shard)."),
    optimizer_offload: Optional[float] = typer.Option(None, help="Fraction 0-1 of the optimizer state kept in host memory and stepped by the CPU (needs --zero >= 1)."),
    activation_offload: Optional[int] = typer.Option(None, help="Leading layers whose activations wait in host memory between forward and backward (Megatron-Core cpu_offloading_num_layers; pp 1, no recompute)."),
    recompute: Optional[str] = typer.Option(None, help="Activation recompute: none, selective or full."),
    recompute_layers: Optional[int] = typer.Option(None, help="With full recompute: the layers of each model chunk that re-run, the first ones (Megatron-Core --recompute-method block --recompute-num-layers); the rest keep their activations."),
    precision: Optional[str] = typer.Option(None, help="fp32, bf16, fp16, fp8 or fp4."),
    fp8_attention: Optional[bool] = typer.Option(None, "--fp8-attention/--no-fp8-attention", help="With fp8 or fp4: dot-product attention in FP8 too (Transformer Engine's fp8_dpa); otherwise it runs in 16 bits."),
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/--no-sequence-parallel"),
    train_tokens: Optional[float] = typer.Option(None, help="Tokens to train, for time, GPU-hours, energy and cost."),
    pue: Optional[float] = typer.Option(None, help="Power usage effectiveness of the data center (default 1.0: IT energy)."),
    grid_carbon: Optional[float] = typer.Option(None, help="Grid carbon intensity, kg CO2e per kWh, for the emissions of training."),
    price: Optional[float] = typer.Option(None, help="Price per device-hour, for the cost of training."),
    grid_region: Optional[str] = typer.Option(None, help="Grid of a region instead of --grid-carbon: ISO country code (FRA) or provider:region (gcp:europe-west1); needs meshplan[carbon]."),
    tco: bool = typer.Option(False, "--tco", help="Price a device-hour by owning the cluster (capital amortized + energy), instead of --price."),
    lifetime_years: Optional[float] = typer.Option(None, help="With --tco: years the capital is amortized over."),
    electricity_price: Optional[float] = typer.Option(None, help="With --tco: electricity price, USD per kWh."),
    strategy: Optional[str] = typer.Option(None, help="Per-layer-kind strategy, innermost network level first (MAD Max), e.g. 'embedding=(mp) dense=(tp,ddp)' for a DLRM or 'transformer=(tp,ddp)' for an LLM."),
    task_kind: Optional[str] = typer.Option(None, "--task", help="pretrain, finetune or inference."),
    frozen_layers: Optional[int] = typer.Option(None, help="Finetune: leading decoder layers kept frozen."),
    batch: Optional[int] = typer.Option(None, help="Inference: sequences served at once."),
    prompt_len: Optional[int] = typer.Option(None, help="Inference: prompt tokens per sequence."),
    output_len: Optional[int] = typer.Option(None, help="Inference: generated tokens per sequence."),
    kv_cache_dtype: Optional[str] = typer.Option(None, help="Inference: the KV cache's element, bf16, fp16 or fp8 (default: the activations')."),
    config: Optional[Path] = typer.Option(None, help="Run config (YAML or JSON)."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key, e.g. plan.tp=4 (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the full result as JSON."),
    trace: Optional[Path] = typer.Option(None, help="Write a Chrome/Perfetto trace of the step here."),
    profile: Optional[Path] = typer.Option(None, help="A measured profile (the profile.yaml of meshplan calibrate) instead of the device's catalog profile."),
):
    """Predict one training step: time, throughput, MFU, memory and where the time goes."""
    from meshplan import api
    from meshplan.config import apply_override, load_config

    cfg = load_config(str(config) if config else None)
    for assignment in set_:
        cfg = apply_override(cfg, assignment)
    flags = locals()
    plan = _section(cfg, "plan")
    plan_flags = {field: flags[flag] for flag, field in _PLAN_FLAGS.items()}
    plan.update({k: v for k, v in plan_flags.items() if v is not None})
    task = _section(cfg, "task")
    task_flags = {"train_tokens": train_tokens, "kind": task_kind, "frozen_layers": frozen_layers,
                  "batch_size": batch, "prompt_len": prompt_len, "output_len": output_len, "kv_cache_dtype": kv_cache_dtype, "pue": pue,
                  "grid_kg_co2e_per_kwh": grid_carbon, "price_per_device_hour": price, **_footprint_flags(
                      grid_region, tco, lifetime_years, electricity_price)}
    task.update({k: v for k, v in task_flags.items() if v is not None})
    _flags_agree_with_set(set_, {"model": model, "cluster": cluster, "devices": devices,
                                 **{f"plan.{field}": flags[flag] for flag, field in _PLAN_FLAGS.items()},
                                 **{f"task.{field}": value for field, value in task_flags.items()}})
    model_ref, cluster_ref = _model_and_cluster(cfg, model, cluster)
    scenario = api.scenario(model_ref, cluster_ref, plan, devices if devices is not None else cfg.get("devices"), task,
                            str(profile) if profile else None)
    result = api.estimate_scenario(scenario)
    from meshplan.timeline.estimate import DLRMEstimate
    from meshplan.units import format_bytes

    if trace:
        try:
            trace.write_text(json.dumps(api.trace(scenario)))
        except OSError as err:
            raise MeshplanError("--trace", str(trace), f"a path to a writable file ({err.strerror})") from None
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        from meshplan.report import dlrm_table, estimate_table, inference_table

        if isinstance(result, DLRMEstimate):
            _console().print(dlrm_table(result))
        else:
            _console().print(inference_table(result) if scenario.task.kind == "inference" else estimate_table(result))
        if trace:
            _console(stderr=True).print(f"trace written to {trace} (open in ui.perfetto.dev)")
    if not result.fits:
        # the full result is printed above; the exit status says the plan cannot run
        raise MeshplanError(
            "memory",
            f"{format_bytes(result.memory.total_bytes, 'GiB')} per device",
            f"the device holds {format_bytes(result.memory.capacity_bytes, 'GiB')}",
            hint="shard the embeddings (embedding=(mp)) or the dense layers (tp, fsdp), or use more devices"
            if isinstance(result, DLRMEstimate) else
            "try a higher --zero stage, --recompute full, more --tp or --pp, or a smaller --micro-batch",
        )


def _footprint_flags(grid_region, tco, lifetime_years, electricity_price) -> dict:
    """The task fields of the footprint flags (a flag left off sets nothing)."""
    return {"grid_region": grid_region, "tco": True if tco else None, "lifetime_years": lifetime_years,
            "electricity_usd_per_kwh": electricity_price}


def _model_and_cluster(cfg: dict, model: str | None, cluster: str | None):
    model_ref = model or cfg.get("model")
    cluster_ref = cluster or cfg.get("cluster")
    if model_ref is None:
        raise MeshplanError("model", None, "give --model ID (see `meshplan catalog list models`) or model: in --config")
    if cluster_ref is None:
        raise MeshplanError("cluster", None, "give --cluster ID (see `meshplan catalog list clusters`) or cluster: in --config")
    return model_ref, cluster_ref


@app.command()
def search(
    model: Optional[str] = typer.Option(None, help="Catalog model id, or a HuggingFace config.json path."),
    cluster: Optional[str] = typer.Option(None, help="Catalog cluster id."),
    devices: Optional[int] = typer.Option(None, help="Number of devices."),
    global_batch: Optional[int] = typer.Option(None, help="Sequences per step."),
    seq_len: Optional[int] = typer.Option(None, help="Tokens per sequence (default: the model's)."),
    precision: Optional[str] = typer.Option(None, help="fp32, bf16, fp16, fp8 or fp4."),
    top: int = typer.Option(10, help="How many of the best plans to show."),
    objective: str = typer.Option("time", help="What to minimize per step: time, energy, edp (energy x time) or cost (needs --price or --tco)."),
    price: Optional[float] = typer.Option(None, help="Price per device-hour, for --objective cost."),
    tco: bool = typer.Option(False, "--tco", help="For --objective cost: price by owning the cluster (capital amortized + energy)."),
    lifetime_years: Optional[float] = typer.Option(None, help="With --tco: years the capital is amortized over."),
    electricity_price: Optional[float] = typer.Option(None, help="With --tco: electricity price, USD per kWh."),
    pue: Optional[float] = typer.Option(None, help="With --tco: power usage effectiveness on the energy (default 1.0)."),
    executor: str = typer.Option("local", help="serial, local (worker processes) or ray."),
    workers: Optional[int] = typer.Option(None, help="Worker processes for --executor local (default: all cores)."),
    store: Optional[Path] = typer.Option(None, help="Keep every evaluated plan here as Parquet; resume from it."),
    config: Optional[Path] = typer.Option(None, help="Run config (YAML or JSON) with an optional space: block."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key, e.g. space.tp=[1,2,4,8] (repeatable)."),
    pareto: bool = typer.Option(False, "--pareto", help="Also show the exact Pareto fronts (time vs memory, vs devices, vs energy)."),
    task_kind: Optional[str] = typer.Option(None, "--task", help="pretrain, finetune or inference (ranks tp x pp by time per output token)."),
    batch: Optional[int] = typer.Option(None, help="Inference: sequences served at once."),
    prompt_len: Optional[int] = typer.Option(None, help="Inference: prompt tokens per sequence."),
    output_len: Optional[int] = typer.Option(None, help="Inference: generated tokens per sequence."),
    kv_cache_dtype: Optional[str] = typer.Option(None, help="Inference: the KV cache's element, bf16, fp16 or fp8 (default: the activations')."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    profile: Optional[Path] = typer.Option(None, help="A measured profile (the profile.yaml of meshplan calibrate) instead of the device's catalog profile."),
):
    """Find the fastest plans of a space that fit in memory (exact, with a lower-bound screen)."""
    from meshplan import api
    from meshplan.config import apply_override, load_config
    from meshplan.explore.pareto import why_slower

    cfg = load_config(str(config) if config else None)
    for assignment in set_:
        cfg = apply_override(cfg, assignment)
    plan = _section(cfg, "plan")
    plan_flags = {"global_batch_size": global_batch, "seq_len": seq_len, "precision": precision}
    plan.update({k: v for k, v in plan_flags.items() if v is not None})
    model_ref, cluster_ref = _model_and_cluster(cfg, model, cluster)
    num_devices = devices if devices is not None else cfg.get("devices")
    if num_devices is None:
        raise MeshplanError("devices", None, "give --devices N or devices: in --config")
    task = _section(cfg, "task")
    task_flags = {"kind": task_kind, "batch_size": batch, "prompt_len": prompt_len, "output_len": output_len,
                  "kv_cache_dtype": kv_cache_dtype, "price_per_device_hour": price, "pue": pue, **_footprint_flags(None, tco, lifetime_years, electricity_price)}
    task.update({k: v for k, v in task_flags.items() if v is not None})
    _flags_agree_with_set(set_, {"model": model, "cluster": cluster, "devices": devices, "plan.global_batch_size": global_batch,
                                 "plan.seq_len": seq_len, "plan.precision": precision,
                                 **{f"task.{field}": value for field, value in task_flags.items()}})
    serving = task.get("kind") == "inference"
    if (serving or _is_dlrm(model_ref)) and (pareto or store):
        raise MeshplanError("--pareto", True, "--pareto and --store are for transformer training searches")
    with _progress("evaluating plans") as report:
        result = api.search(
            model_ref, cluster_ref, num_devices, plan, _section(cfg, "space"), top, task,
            progress=report, executor=executor, workers=workers, store=str(store) if store else None,
            profile=str(profile) if profile else None, objective=objective,
        )
    fronts = None
    if pareto:
        with _progress("Pareto fronts") as report:
            fronts = api.pareto(model_ref, cluster_ref, num_devices, plan, _section(cfg, "space"), task, progress=report,
                                profile=str(profile) if profile else None)
    dlrm = bool(result.top) and "strategy" in result.top[0]
    runner_up = why_slower(result.top[0], result.top[1]) if len(result.top) > 1 and not (serving or dlrm) and objective == "time" else None
    summary = (
        f"{result.space_size} points in the space, {result.candidates} valid plans, {result.evaluated} evaluated "
        f"exactly ({result.infeasible_memory} do not fit, {result.reused} reused from the store), {result.wall_s:.2f} s"
    )
    if as_json:
        payload = {k: v for k, v in result.__dict__.items() if k != "evaluated_rows"}
        payload["runner_up"] = runner_up
        if fronts:
            payload["pareto"] = fronts
        typer.echo(json.dumps(payload, indent=2))
    else:
        from meshplan.report import dlrm_search_table, front_table, runner_up_line, search_table, serving_table

        console = _console()
        console.print(serving_table(result) if serving else dlrm_search_table(result) if dlrm else search_table(result, objective))
        if runner_up:
            console.print(runner_up_line(runner_up))
        if fronts:
            console.print(front_table("Pareto front: step time vs memory per device", fronts["memory"]))
            console.print(front_table("Pareto front: step time vs devices used", fronts["devices"]))
            if fronts["energy"]:
                console.print(front_table("Pareto front: step time vs energy per step", fronts["energy"]))
    _console(stderr=True).print(summary)


def _is_dlrm(model_ref) -> bool:
    from meshplan.api import resolve_model
    from meshplan.specs.dlrm import DLRMModel

    return isinstance(resolve_model(model_ref), DLRMModel)


class _progress:
    """A progress bar on stderr (quiet when stderr is not a terminal)."""

    def __init__(self, label: str):
        from rich.progress import Progress

        console = _console(stderr=True)
        # piped or captured: no bar at all (rich would still leave an empty line on stderr)
        self._bar = Progress(console=console, transient=True) if console.is_terminal else None
        self._label = label
        self._task = None

    def __enter__(self):
        if self._bar:
            self._bar.__enter__()
            self._task = self._bar.add_task(self._label, total=None)
        return self.update

    def update(self, done: int, total: int) -> None:
        if self._bar:
            self._bar.update(self._task, completed=done, total=total)

    def __exit__(self, *exc):
        return self._bar.__exit__(*exc) if self._bar else None


def _flags_agree_with_set(assignments: list[str], flags: dict[str, object]) -> None:
    """A flag and a ``--set`` of the same key must agree: neither silently wins over the other.
    (A flag does override the --config file, as --set does.)"""
    from meshplan.config import apply_override

    given: dict = {}
    for assignment in assignments:
        given = apply_override(given, assignment)
    for path, value in flags.items():
        node: object = given
        for key in path.split("."):
            node = node.get(key, _UNSET) if isinstance(node, dict) else _UNSET
        if value is not None and node is not _UNSET and node != value:
            raise MeshplanError(f"--set {path}", node, f"disagrees with the flag given for it ({value!r}); give the value once")


_UNSET = object()


def _section(cfg: dict, key: str) -> dict:
    """A copy of the ``plan:`` or ``task:`` mapping of a run config (empty if absent)."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        example = {"plan": "--set plan.tp=8", "task": "--set task.train_tokens=3e11", "space": "--set space.tp=[1,2,4,8]"}[key]
        raise MeshplanError(key, value, f"a mapping of {key} fields: {example}, or a '{key}:' block in --config")
    return dict(value)


@app.command()
def validate(
    file: Path = typer.Argument(..., help="Validation cases (shared/validation/SCHEMA.md format)."),
    as_json: bool = typer.Option(False, "--json", help="Print one object per case as JSON."),
    profile: Optional[Path] = typer.Option(None, help="A measured profile (meshplan calibrate) for the cases on its device."),
):
    """Compare predicted step times (and peak memory, where a case gives it) with published, measured runs."""
    from meshplan.io.validation_cases import summarize
    from meshplan.io.validation_cases import validate as run

    with _progress("predicting cases") as report:
        results = run(file, progress=report, profile=str(profile) if profile else None)
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in results], indent=2))
        return
    from meshplan.report import validation_tables

    for table in validation_tables(results, summarize(results)):
        _console().print(table)


@app.command()
def calibrate(
    out: Path = typer.Option(Path("calibration"), help="Folder for the measured CSVs, env.json and profile.yaml; a rerun resumes it."),
    model: Optional[str] = typer.Option(None, help="Catalog model id or HuggingFace config.json whose per-rank GEMM and attention shapes to measure."),
    tp: str = typer.Option("1,2,4,8", help="Tensor-parallel degrees of the model's shapes, comma-separated."),
    device: Optional[str] = typer.Option(None, help="Catalog device the profile is fitted for (default: this GPU, matched by name)."),
    on: str = typer.Option("auto", help="Measure on auto (a GPU if there is one), cuda or cpu."),
    quick: bool = typer.Option(False, "--quick", help="Tiny sizes and few repeats: seconds on a CPU (a smoke test, not a calibration)."),
    fit_only: bool = typer.Option(False, "--fit-only", help="Measure nothing: fit the CSVs already in --out."),
    profile_out: Optional[Path] = typer.Option(None, help="Where to write the profile (default: OUT/profile.yaml)."),
    power_seconds: Optional[float] = typer.Option(None, help="Seconds of each sustained power workload on an NVIDIA GPU (NVML energy counter; default 5, 1 with --quick); 0: none."),
):
    """Measure GEMMs, attention, memory ops and power here (under torchrun: collectives) and fit a profile."""
    from meshplan.calibrate import collectives
    from meshplan.calibrate.run import make_request, measure_collectives, measure_kernels, measure_power, write_profile

    request, fit_device = make_request(out, model, tp, device, on, quick, measure=not fit_only, power_seconds=power_seconds)
    writer, notes = True, []
    if collectives.launched() and not fit_only:
        with _progress("measuring collectives") as report:
            notes, writer = measure_collectives(request, report)
    elif not fit_only:
        with _progress("measuring kernels") as report:
            notes = measure_kernels(request, report)
        with _progress("measuring power") as report:
            notes += measure_power(request, report)
    err = _console(stderr=True)
    if not writer:
        return
    for note in notes:
        err.print(f"note: {note}", soft_wrap=True)
    if not (out / "gemm_bf16.csv").exists():
        err.print(f"note: no kernels in {out} yet: run `meshplan calibrate --out {out}` without torchrun to measure them, then fit")
        return
    target = profile_out or out / "profile.yaml"
    fitted = write_profile(out, fit_device, target)
    fit = fitted["fit"]
    err.print(f"profile for {fit_device.id} written to {target}: matmul e_max {fit['matmul']['e_max']:.3f}, "
              f"attention e_max {fit['attention']['e_max']:.3f}, memory {fit['memory']['memory']:.3f} of peak "
              f"(use it with --profile {target})", soft_wrap=True)
    kernels = fit["kernels"]
    err.print(f"kernel models fitted: {kernels['summary']}" if kernels["fitted"]
              else f"note: no kernel models fitted ({kernels['reason']}); the profile has the matmul and attention curves only",
              soft_wrap=True)
    power = fit.get("power")
    if power is not None:
        err.print(f"power model fitted: {power['summary']}" if power["fitted"]
                  else f"note: no power model fitted ({power['reason']}); estimates with this profile carry no energy",
                  soft_wrap=True)
    overlap = fit["overlap"]
    if overlap["fitted"] or (out / "overlap.csv").exists():
        err.print(f"compute beside collectives fitted: {overlap['summary']}" if overlap["fitted"]
                  else f"note: overlap_slowdown kept from the catalog ({overlap['reason']})", soft_wrap=True)


@app.command()
def report(
    input_: Path = typer.Argument(..., metavar="INPUT", help="A search --store folder, or an estimate, search or validate --json file."),
    out: Path = typer.Option(..., "--out", "-o", help="The HTML file to write; with --format png/svg/pdf, a folder (one file per figure)."),
    fmt: str = typer.Option("html", "--format", help="html (one self-contained page), png, svg or pdf."),
    trace: Optional[Path] = typer.Option(None, help="A trace from meshplan estimate --trace: adds the per-device timeline."),
    top: int = typer.Option(10, help="How many of the best plans a search report shows."),
    price: Optional[float] = typer.Option(None, help="Price per device-hour: adds a search's front of step time against cost per step."),
):
    """Draw stored results: breakdowns, memory, Pareto fronts, the timeline, validation errors."""
    from meshplan.plots import write_report

    written = write_report(input_, out, fmt, trace, top, price)
    _console(stderr=True).print(f"report written to {out}" + (f" ({len(written)} files)" if fmt != "html" else ""))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("meshplan")
    except PackageNotFoundError:
        from meshplan import __version__

        return __version__


def main() -> None:
    """Entry point: bad input is one clear line on stderr and exit code 2, never a traceback;
    an interrupt is "interrupted" and exit code 130."""
    try:
        # outside standalone mode typer returns the exit code of ctx.exit(): 130 for Ctrl-C
        # (typer >= 0.13 turns KeyboardInterrupt into Exit(130); typer.Abort and typer.Exit are
        # click's own classes before typer vendored click, and the vendored ones after)
        code = app(standalone_mode=False)
        if code == 130:
            raise KeyboardInterrupt
        if isinstance(code, int) and not isinstance(code, bool) and code:
            sys.exit(code)
    except MeshplanError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as err:
        sys.exit(err.exit_code)
    except BrokenPipeError:  # e.g. `meshplan ... | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    except Exception as err:  # click's usage errors and anything unexpected
        if is_usage_error(err):
            message = usage_message(err)
            if not message:  # a bare `meshplan` (or group): its help is printed, which is what was asked
                sys.exit(0)
            print(f"error: {message}", file=sys.stderr)
            sys.exit(2)
        if os.environ.get("MESHPLAN_DEBUG"):
            raise
        print(f"internal error: {type(err).__name__}: {err} (set MESHPLAN_DEBUG=1 for a traceback)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
