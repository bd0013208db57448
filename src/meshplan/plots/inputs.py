"""The stored results a report is built from, recognised by their shape.

- a ``meshplan search --store`` folder (``plans-*.parquet`` and ``search.json``): every
  evaluated plan, the job that was searched;
- a ``meshplan search --json`` file: the top plans (and ``pareto`` fronts with ``--pareto``);
- a ``meshplan estimate --json`` file: one training step's estimate, a serving request's
  (``--task inference``) or a DLRM iteration's;
- a ``meshplan validate --json`` file: one object per validation case;
- a ``meshplan estimate --trace`` file (Chrome trace), given with ``--trace``: the timeline.

Nothing here runs a model: a report can be rebuilt from these files alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from meshplan.errors import MeshplanError, one_line
from meshplan.units import finite_number

KINDS = ("store", "search", "estimate", "inference", "dlrm", "validation")
_CASE_KEYS = {"id", "group", "measured_step_time_s", "predicted_step_time_s", "relative_error"}
_WHAT = "a meshplan search --store folder, or a JSON file written by meshplan estimate, search or validate --json"
#: the keys meshplan's JSON gives numbers under (SI units in the name, and the ratios): their
#: values, and the values of a mapping under them, are finite numbers or null
_NUMBER_KEY = re.compile(r"(_s|_bytes|_j|_w|_per_s|_usd|_flop|_fraction)$|^(mfu|hfu|relative_error)$")
_WRITERS = {"store": "search --store", "search": "search --json", "validation": "validate --json"}


def writer(kind: str) -> str:
    """The meshplan command that writes a stored result of ``kind``."""
    return _WRITERS.get(kind, "estimate --json")


@dataclass(frozen=True)
class Source:
    kind: str  # one of KINDS
    path: str
    data: object  # estimate: its dict; validation: list of case dicts; search/store: see load_search
    job: dict | None = None  # store: the search.json of the job


def load(path: str | Path) -> Source:
    """The stored result at ``path``, its kind recognised from its shape."""
    path = Path(path)
    try:
        if path.is_dir():
            return _store(path)
        if not path.exists():
            raise MeshplanError("INPUT", str(path), f"an existing file or folder: {_WHAT}")
    except (OSError, ValueError) as err:  # a name too long, an embedded NUL
        raise MeshplanError("INPUT", str(path), f"a readable path ({err})") from None
    source = _recognised(path, _json(path, "INPUT"))
    _numbers_where_numbers_go(source)
    return source


def _recognised(path: Path, data: object) -> Source:
    if isinstance(data, list) and data and all(isinstance(c, dict) and _CASE_KEYS <= set(c) for c in data):
        return Source("validation", str(path), data)
    if isinstance(data, dict) and isinstance(data.get("breakdown"), dict) and isinstance(data.get("memory"), dict) \
            and isinstance(data.get("roles"), list):
        return Source("estimate", str(path), data)
    if isinstance(data, dict) and isinstance(data.get("top"), list) and "space_size" in data:
        if not data["top"] or not all(isinstance(r, dict) and "step_time_s" in r for r in data["top"]):
            raise MeshplanError("INPUT", str(path), "a search with at least one plan that fits (this one has none)")
        if "strategy" in data["top"][0] or "tpot_s" in data["top"][0]:
            raise MeshplanError("INPUT", str(path), "a transformer training search (DLRM and serving searches are not drawn yet)")
        return Source("search", str(path), data)
    if isinstance(data, list) and not data:
        raise MeshplanError("INPUT", str(path), "a validation file with at least one case (this one is empty)")
    if isinstance(data, dict) and isinstance(data.get("memory"), dict):
        if isinstance(data.get("prefill"), dict) and isinstance(data.get("decode"), dict) and "ttft_s" in data:
            return Source("inference", str(path), data)
        if "iteration_s" in data and isinstance(data.get("serialized_by_kind_s"), dict):
            return Source("dlrm", str(path), data)
    raise MeshplanError("INPUT", str(path), _WHAT)


def _numbers_where_numbers_go(source: Source) -> None:
    """A file with the shape of meshplan's JSON whose numbers are not all numbers (edited by
    hand, damaged) is refused naming the first value that is not, by its path in the file."""
    def walk(node, path: tuple, numeric: bool):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, (*path, key), numeric or bool(_NUMBER_KEY.search(str(key))))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from walk(value, (*path, index), numeric)
        elif numeric and node is not None and not finite_number(node):
            yield path, node

    written_by = writer(source.kind)
    try:
        where, value = next(walk(source.data, (), False), (None, None))
    except RecursionError:
        raise MeshplanError("INPUT", source.path, f"a file as meshplan {written_by} writes it (this one nests too deep)") from None
    if where is not None:
        at = ".".join(str(p) for p in where)
        raise MeshplanError("INPUT", source.path, f"a file as meshplan {written_by} writes it ({at} holds {one_line(repr(value), 40)}, not a number)")


def load_trace(path: str | Path) -> dict:
    """A Chrome trace written by ``meshplan estimate --trace``."""
    data = _json(Path(path), "--trace")
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list) or not any(isinstance(e, dict) and e.get("ph") == "X" for e in events):
        raise MeshplanError("--trace", str(path), "a trace written by meshplan estimate --trace (traceEvents with tasks)")
    return data


def _json(path: Path, flag: str) -> object:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise MeshplanError(flag, str(path), f"a readable file ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise MeshplanError(flag, str(path), f"a JSON file: {_WHAT}") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise MeshplanError(flag, str(path), f"valid JSON ({err.__class__.__name__}): {_WHAT}") from None


def _store(folder: Path) -> Source:
    from meshplan.explore.store import PART_GLOB

    parts = sorted(folder.glob(PART_GLOB))
    manifest = folder / "search.json"
    if not parts or not manifest.exists():
        raise MeshplanError("INPUT", str(folder), "a folder written by meshplan search --store (plans-*.parquet and "
                            "search.json); this one has " + ("no plans" if not parts else "no search.json"))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MeshplanError("INPUT", str(folder), "install the store extra to read a store: pip install 'meshplan[store]'") from None
    rows: list[dict] = []
    for part in parts:
        try:
            rows.extend(pq.read_table(part).to_pylist())
        except (OSError, pa.ArrowException) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise MeshplanError("INPUT", str(part), f"a Parquet part written by meshplan search ({first})") from None
    job = _json(manifest, "INPUT")
    if not isinstance(job, dict):
        raise MeshplanError("INPUT", str(manifest), "the search.json meshplan search --store wrote")
    if not any(r.get("fits") and r.get("step_time_s") is not None for r in rows):
        raise MeshplanError("INPUT", str(folder), "a store with at least one plan that fits (none of its plans fits)")
    return Source("store", str(folder), rows, job)
