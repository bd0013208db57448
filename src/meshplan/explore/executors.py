"""Executors for exact evaluation: anything shaped like ``concurrent.futures.Executor``.

``serial`` runs in this process; ``local`` uses worker processes; ``ray`` runs tasks on a Ray
cluster (the ``ray`` extra; a local instance starts if none is running).
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import Executor, Future, ProcessPoolExecutor

from meshplan.errors import MeshplanError

EXECUTORS = ("serial", "local", "ray")


class SerialExecutor(Executor):
    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(err)
        return future


class RayExecutor(Executor):
    """Submits each call as a Ray task; futures come from the task's object reference."""

    def __init__(self):
        try:
            import ray
        except ImportError:
            raise MeshplanError("--executor", "ray", "install the ray extra: pip install 'meshplan[ray]'") from None
        self._ray = ray
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        self._remote = {}

    def submit(self, fn, /, *args, **kwargs) -> Future:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(fn)
        return remote.remote(*args, **kwargs).future()


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def make_executor(name: str, workers: int | None = None) -> Executor:
    """``workers`` is checked by the caller (meshplan.api.search checks every search option first)."""
    if name == "serial":
        return SerialExecutor()
    if name == "local":
        # workers ignore Ctrl-C: the parent alone stops the search and keeps what finished
        return ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1, initializer=_ignore_interrupts)
    if name == "ray":
        return RayExecutor()
    raise MeshplanError("--executor", name, f"one of {', '.join(EXECUTORS)}")
