"""Reading YAML and JSON files with errors that name the file, line and column.

Every file a user names is read here, so every way a file can be bad (missing, unreadable, not
UTF-8, malformed, nested deeper than any meshplan input) is one MeshplanError naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from meshplan.errors import MeshplanError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: deeper nesting than any meshplan input needs; libyaml's C composer recurses without a limit
#: (100k nested '[' crash the interpreter), so documents are checked before they are built
MAX_DEPTH = 64


class MalformedFile(MeshplanError):
    """Text that is not valid YAML or JSON (a ``--set`` value falls back to a plain string)."""


def read_text(path: str | Path, what: str = "file") -> str:
    """The text of a UTF-8 file; a missing, unreadable or binary file is a MeshplanError."""
    path = Path(path)
    try:
        exists = path.is_file()
    except (OSError, ValueError) as err:  # e.g. an embedded NUL in the path
        raise MeshplanError(what, str(path), f"a valid file path ({err})") from None
    if not exists:
        raise MeshplanError(what, str(path), "no such file")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise MeshplanError(what, str(path), f"a readable file ({err.strerror or err})") from None
    except ValueError as err:  # e.g. an embedded NUL in the path
        raise MeshplanError(what, str(path), f"a valid file path ({err})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise MeshplanError(str(path), f"byte {err.start}", "a UTF-8 text file (this looks binary)") from None


def load_yaml_or_json(path: str | Path):
    path = Path(path)
    text = read_text(path)
    if path.suffix == ".json":
        return parse_json(text, str(path))
    return parse_yaml(text, str(path))


def parse_json(text: str, where: str):
    """JSON text as Python data, at most MAX_DEPTH deep."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise MalformedFile(where, f"line {err.lineno} column {err.colno}", f"malformed JSON: {err.msg}") from None
    except RecursionError:
        raise _too_deep(where) from None
    if _depth(data) > MAX_DEPTH:
        raise _too_deep(where)
    return data


def parse_yaml(text: str, where: str):
    """YAML text as Python data, at most MAX_DEPTH deep (checked on the event stream first)."""
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _too_deep(where)
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1} column {mark.column + 1}" if mark else "?"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise MalformedFile(where, at, f"malformed YAML: {problem}") from None
    except RecursionError:
        raise _too_deep(where) from None


def _too_deep(where: str) -> MeshplanError:
    return MeshplanError(where, f"more than {MAX_DEPTH} levels of nesting", f"at most {MAX_DEPTH} nested lists or mappings")


def _depth(data) -> int:
    """How deeply lists and mappings nest in ``data`` (iterative: no recursion limit)."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest
