"""Commands that read what meshplan holds: the built-in catalog and stored search results; and
the console every command prints through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from meshplan.errors import MeshplanError

HELP = {"help_option_names": ["-h", "--help"]}

catalog_app = typer.Typer(no_args_is_help=True, context_settings=HELP, help="List and show built-in devices, clusters and models.")


def console(stderr: bool = False):
    from rich.console import Console

    out = Console(stderr=stderr)
    if not out.is_terminal:  # piped or captured: do not squeeze tables into 80 columns
        out = Console(stderr=stderr, width=160)
    return out


results_app = typer.Typer(no_args_is_help=True, context_settings=HELP, help="Query stored search results with SQL (DuckDB).")


@results_app.command("query")
def results_query(
    folder: Path = typer.Argument(..., help="A --store folder of meshplan search."),
    sql: str = typer.Argument(..., help="SQL over the view `plans`, e.g. select tp, pp, step_time_s from plans order by 3 limit 5"),
    as_json: bool = typer.Option(False, "--json", help="Print rows as JSON objects."),
):
    """Run SQL over every plan a search stored."""
    from meshplan.explore.store import query

    columns, rows = query(folder, sql)
    if as_json:
        # NaN and infinities (from the query's own arithmetic) are null: JSON has no such numbers
        rows = [[None if isinstance(v, float) and (v != v or abs(v) == float("inf")) else v for v in row] for row in rows]
        typer.echo(json.dumps([dict(zip(columns, row)) for row in rows], indent=2, default=str))
        return
    from rich.table import Table

    table = Table(header_style="bold")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(f"{v:.6g}" if isinstance(v, float) else str(v) for v in row))
    console().print(table)


@catalog_app.command("list")
def catalog_list(kind: Optional[str] = typer.Argument(None, help="devices, clusters or models (default: all).")):
    """List the ids in the built-in catalog."""
    from meshplan import catalog

    kinds = {"devices": catalog.device_ids, "clusters": catalog.cluster_ids,
             "models": lambda: [*catalog.model_ids(), *catalog.dlrm_model_ids()]}
    if kind is not None and kind not in kinds:
        raise MeshplanError("kind", kind, f"one of {', '.join(kinds)}")
    for name, ids in kinds.items():
        if kind in (None, name):
            typer.echo(f"{name}:")
            for item in ids():
                typer.echo(f"  {item}")


@catalog_app.command("show")
def catalog_show(item: str = typer.Argument(..., help="A device, cluster or model id.")):
    """Show one catalog entry with the source of each number."""
    import yaml

    from meshplan import catalog

    kind, entry = catalog.find(item)
    typer.echo(f"# {kind[:-1]} {item}")
    typer.echo(yaml.safe_dump(entry, sort_keys=False, width=110).rstrip())
