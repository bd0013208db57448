"""Reading YAML and JSON files with errors that name the file, line and column."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from meshplan.errors import MeshplanError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_or_json(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise MeshplanError("file", str(path), "no such file")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise MeshplanError(str(path), f"line {err.lineno} column {err.colno}", f"malformed JSON: {err.msg}") from None
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "?"
        problem = getattr(err, "problem", None) or str(err)
        raise MeshplanError(str(path), where, f"malformed YAML: {problem}") from None
