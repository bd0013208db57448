"""Edits of nested data (parsed JSON or YAML) for tests that damage inputs on purpose."""

from __future__ import annotations

import json


def paths(data, prefix=()):
    """Every key path into nested mappings and lists."""
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from paths(value, (*prefix, index))


def mutate(data, path, value, delete=False):
    """A deep copy of ``data`` with ``path`` set to ``value`` (or removed)."""
    data = json.loads(json.dumps(data))
    if not path:
        return value
    node = data
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data
