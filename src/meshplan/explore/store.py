"""A store of evaluated plans: Parquet parts in a folder, queryable with DuckDB.

Each search writes rows as it goes (``plans-NNNNN.parquet``), so an interrupted search keeps
what it finished and a later search with the same store skips those plans. ``search.json``
records what was searched; a store only resumes the same job.
Needs the ``store`` extra (pyarrow, duckdb).
"""

from __future__ import annotations

import json
from pathlib import Path

from meshplan.errors import MeshplanError

PART_GLOB = "plans-*.parquet"


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MeshplanError("--store", "pyarrow", "install the store extra: pip install 'meshplan[store]'") from None
    return pa, pq


class PlanStore:
    """Rows of one search job in ``folder``."""

    def __init__(self, folder: str | Path, job: dict, columns: dict[str, str]):
        _pyarrow()  # say which extra is missing before creating anything
        self.columns = columns  # column -> arrow type name, fixed for every part
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MeshplanError("--store", str(self.folder), f"a folder meshplan can create or use ({err.strerror})") from None
        manifest = self.folder / "search.json"
        if manifest.is_file():
            try:
                stored = json.loads(manifest.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                raise MeshplanError("--store", str(manifest), "a search.json written by meshplan search (this one is corrupt)",
                                    hint="use a new folder") from None
            if stored != job:
                raise MeshplanError(
                    "--store", str(self.folder),
                    "this folder holds a different search (model, cluster, devices, plan or space differ)",
                    hint="use a new folder, or the same options as the stored search",
                )
        else:
            try:
                manifest.write_text(json.dumps(job, indent=2, sort_keys=True))
            except OSError as err:
                raise MeshplanError("--store", str(self.folder), f"a writable folder ({err.strerror})") from None
        self._buffer: list[dict] = []
        self._parts = len(list(self.folder.glob(PART_GLOB)))

    def load(self) -> list[dict]:
        """Every row stored so far."""
        pa, pq = _pyarrow()
        rows: list[dict] = []
        for part in sorted(self.folder.glob(PART_GLOB)):
            try:
                rows.extend(pq.read_table(part).to_pylist())
            except (OSError, pa.ArrowException) as err:
                raise MeshplanError("--store", str(part), f"a Parquet part written by meshplan search ({err})",
                                    hint="delete that part to evaluate its plans again") from None
        return rows

    def add(self, row: dict, flush_every: int = 512) -> None:
        self._buffer.append(row)
        if len(self._buffer) >= flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        pa, pq = _pyarrow()
        path = self.folder / f"plans-{self._parts:05d}.parquet"
        tmp = path.with_suffix(".tmp")
        schema = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in self.columns.items()])
        try:
            pq.write_table(pa.Table.from_pylist(self._buffer, schema=schema), tmp)
            tmp.rename(path)  # a part is either complete or absent
        except OSError as err:
            raise MeshplanError("--store", str(self.folder), f"a writable folder ({err.strerror or err})") from None
        self._parts += 1
        self._buffer = []


def query(folder: str | Path, sql: str) -> tuple[list[str], list[tuple]]:
    """Run ``sql`` against the view ``plans`` of every stored row; (columns, rows)."""
    try:
        import duckdb
    except ImportError:
        raise MeshplanError("results", "duckdb", "install the store extra: pip install 'meshplan[store]'") from None
    folder = Path(folder)
    parts = sorted(str(p) for p in folder.glob(PART_GLOB)) if folder.is_dir() else []
    if not parts:
        raise MeshplanError("results", str(folder), "no stored plans here (run meshplan search --store FOLDER first)")
    con = duckdb.connect()
    try:  # the parts are named as a list, never pasted into SQL
        con.read_parquet(parts).create_view("plans")
    except duckdb.Error as err:
        raise MeshplanError("results", str(folder), f"Parquet parts written by meshplan search ({str(err).splitlines()[0]})") from None
    try:
        cursor = con.execute(sql)
    except duckdb.Error as err:
        raise MeshplanError("query", sql, f"DuckDB could not run it: {str(err).splitlines()[0]}") from None
    columns = [d[0] for d in cursor.description]
    return columns, cursor.fetchall()
