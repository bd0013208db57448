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
        manifest = self.folder / "search.json"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            stored = _manifest(manifest) if manifest.exists() else None
            if stored is None:
                manifest.write_text(json.dumps(job, indent=2, sort_keys=True))
                stored = job
            self._parts = len(list(self.folder.glob(PART_GLOB)))
        except OSError as err:  # a file where the folder should be, no permission, a bad name
            raise MeshplanError("--store", str(self.folder), f"a folder meshplan can create and write ({err.strerror or err})") from None
        except ValueError as err:  # an embedded NUL
            raise MeshplanError("--store", str(self.folder), f"a valid folder path ({err})") from None
        if stored != job:
            raise MeshplanError(
                "--store", str(self.folder),
                "this folder holds a different search (model, cluster, devices, plan or space differ)",
                hint="use a new folder, or the same options as the stored search",
            )
        self._buffer: list[dict] = []

    def load(self) -> list[dict]:
        """Every row stored so far."""
        pa, pq = _pyarrow()
        rows: list[dict] = []
        for part in sorted(self.folder.glob(PART_GLOB)):
            try:
                table = pq.read_table(part)
            except (OSError, pa.ArrowException) as err:
                raise MeshplanError("--store", str(part), f"a Parquet part written by meshplan ({_first_line(err)})",
                                    hint="delete the damaged part, or use a new folder") from None
            if set(table.column_names) != set(self.columns):
                raise MeshplanError("--store", str(part), f"a part with the columns {', '.join(self.columns)}",
                                    hint="delete the part, or use a new folder") from None
            rows.extend(table.to_pylist())
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
            raise MeshplanError("--store", str(self.folder), f"a folder meshplan can write ({err.strerror or err})") from None
        self._parts += 1
        self._buffer = []


def query(folder: str | Path, sql: str) -> tuple[list[str], list[tuple]]:
    """Run ``sql`` against the view ``plans`` of every stored row; (columns, rows)."""
    try:
        import duckdb
    except ImportError:
        raise MeshplanError("results", "duckdb", "install the store extra: pip install 'meshplan[store]'") from None
    if not sql.strip():
        raise MeshplanError("sql", sql, "a query over the view plans, e.g. 'select tp, pp, step_time_s from plans order by 3 limit 5'")
    folder = Path(folder)
    try:
        parts = sorted(p.as_posix() for p in folder.glob(PART_GLOB))
    except (OSError, ValueError):
        parts = []
    if not parts:
        raise MeshplanError("results", str(folder), "no stored plans here (run meshplan search --store FOLDER first)")
    con = duckdb.connect()
    try:
        # the file list is a parameter: a path is never pasted into SQL (quotes, globs)
        con.read_parquet(parts).create_view("plans")
    except duckdb.Error as err:
        raise MeshplanError("results", str(folder), f"Parquet parts written by meshplan search ({_first_line(err)})") from None
    try:
        cursor = con.execute(sql)
        description = getattr(cursor, "description", None) or ()
        columns = [d[0] for d in description]
        rows = cursor.fetchall() if columns else []
    except duckdb.Error as err:
        raise MeshplanError("query", sql, f"DuckDB could not run it: {_first_line(err)}") from None
    return columns, rows


def _manifest(path: Path) -> object:
    """The job recorded in ``search.json``; a damaged one is an error naming the file."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise MeshplanError("--store", str(path), "the search.json meshplan wrote (this one is damaged)",
                            hint="delete it with the parts beside it, or use a new folder") from None


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
