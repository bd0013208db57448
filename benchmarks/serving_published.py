"""The serving estimate against TensorRT-LLM's published figures (tests/data/trtllm_perf.yaml):
each row's prediction and error, and per system and figure the median and largest error.

    python benchmarks/serving_published.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_serving_published import first_token_rows, throughput_rows  # noqa: E402


def main() -> None:
    groups: dict[str, list[float]] = {}
    for label, row, predicted, measured in (*throughput_rows(), *first_token_rows()):
        error = predicted / measured - 1.0
        groups.setdefault(f"{row[0]} {label}", []).append(error)
        print(f"{row[0]:5s} {label:11s} {' '.join(map(str, row[1:-1])):32s} measured {measured:9.1f} predicted {predicted:9.1f} {error:+7.1%}")
    print()
    for group, errors in groups.items():
        print(f"{group:18s} {len(errors):3d} rows  median |error| {statistics.median(map(abs, errors)):6.1%}  max {max(map(abs, errors)):6.1%}")


if __name__ == "__main__":
    main()
