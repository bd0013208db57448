"""How fast is one estimate? In process, and as the whole `meshplan estimate` command.

    python benchmarks/bench_estimate.py

The plan is Megatron-LM's 1T-parameter run (Narayanan et al. SC21, Table 1): megatron-1t on
3072 A100 80GB GPUs, tp=8, pp=64, dp=6, global batch 3072, micro-batch 1, full recompute.
Prints the median of 100 in-process calls of ``meshplan.estimate`` (target < 5 ms) and the median
of 10 runs of the CLI as a subprocess, interpreter start-up and imports included (target < 0.6 s),
each with PASS or FAIL. Always exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time

import meshplan

MODEL = "megatron-1t"
CLUSTER = "dgx-a100-80gb"
DEVICES = 3072
PLAN = {"tp": 8, "pp": 64, "dp": 6, "global_batch_size": 3072, "micro_batch_size": 1, "recompute": "full"}
CLI_ARGS = [
    "estimate", "--model", MODEL, "--cluster", CLUSTER, "--devices", str(DEVICES),
    "--tp", "8", "--pp", "64", "--dp", "6", "--global-batch", "3072", "--micro-batch", "1",
    "--recompute", "full",
]

IN_PROCESS_RUNS = 100
IN_PROCESS_TARGET_S = 5e-3
CLI_RUNS = 10
CLI_TARGET_S = 0.6


def median_s(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def in_process_s() -> float:
    """Median wall time of one ``meshplan.estimate`` call, catalog already loaded (one warm-up)."""

    def run():
        meshplan.estimate(MODEL, CLUSTER, num_devices=DEVICES, **PLAN)

    run()
    return median_s(run, IN_PROCESS_RUNS)


def cli_command() -> list[str]:
    """The installed ``meshplan`` script, or the same entry point through this interpreter."""
    script = shutil.which("meshplan")
    if script:
        return [script, *CLI_ARGS]
    return [sys.executable, "-c", "from meshplan.cli import main; main()", *CLI_ARGS]


def cli_s() -> float:
    """Median wall time of the whole command as a user runs it (table output, discarded): with
    Python's bytecode cache, as a default interpreter keeps it (PYTHONDONTWRITEBYTECODE, set on
    some build machines, would compile every module from source at each start: about 0.07 s
    more here), after one warm-up run that fills the cache."""
    command = cli_command()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def run():
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    run()
    return median_s(run, CLI_RUNS)


def verdict(value: float, target: float) -> str:
    return "PASS" if value < target else "FAIL"


def report(label: str, measure, target_s: float, unit_s: float, unit: str, runs: int) -> None:
    try:
        value = measure()
    except Exception as err:  # report, never crash: the script exits 0 regardless
        print(f"{label}: could not run ({err}) FAIL")
        return
    print(
        f"{label}: median {value / unit_s:.3g} {unit} over {runs} runs "
        f"(target < {target_s / unit_s:g} {unit}) {verdict(value, target_s)}"
    )


def main() -> int:
    print(f"plan: {MODEL} on {DEVICES} x {CLUSTER}, {PLAN}")
    report("in-process meshplan.estimate", in_process_s, IN_PROCESS_TARGET_S, 1e-3, "ms", IN_PROCESS_RUNS)
    report("`meshplan estimate` command", cli_s, CLI_TARGET_S, 1.0, "s", CLI_RUNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
