"""Run the meshplan CLI in-process for tests."""

from __future__ import annotations

import sys

from meshplan.cli import main


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run ``meshplan ARGS`` in-process; (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["meshplan", *args])
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err
