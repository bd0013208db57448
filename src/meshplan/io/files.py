"""Reading YAML and JSON files with errors that name the file, line and column."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from meshplan.errors import MeshplanError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


#: deeper YAML is refused before parsing: libyaml's C parser overflows the stack (a crash, not
#: an exception) somewhere past tens of thousands of levels, and no run config needs more than a few
MAX_NESTING = 100


def _nesting(text: str) -> int:
    """The deepest nesting of flow collections ([...], {...}) and of indented blocks, outside
    quoted strings (an upper bound good enough to refuse pathological input cheaply)."""
    depth = deepest = 0
    quote = None
    for char in text:
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(depth - 1, 0)
        elif char == "\n":
            quote = None
    indents = {len(line) - len(line.lstrip(" -")) for line in text.splitlines() if line.strip()}
    return max(deepest, len(indents))


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
    if path.suffix != ".json" and _nesting(text) > MAX_NESTING:
        raise MeshplanError(str(path), "nesting", f"YAML nested at most {MAX_NESTING} levels deep")
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
