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
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise MeshplanError(str(path), f"byte {err.start}", "a UTF-8 text file (YAML or JSON)") from None
    except OSError as err:
        raise MeshplanError("file", str(path), f"a readable file ({err.strerror})") from None
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.load(text, Loader=_LOADER)
    except RecursionError:
        raise MeshplanError(str(path), "nesting", "YAML or JSON nested less deeply") from None
    except json.JSONDecodeError as err:
        raise MeshplanError(str(path), f"line {err.lineno} column {err.colno}", f"malformed JSON: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "?"
        problem = getattr(err, "problem", None) or str(err)
        raise MeshplanError(str(path), where, f"malformed YAML: {problem}") from None
