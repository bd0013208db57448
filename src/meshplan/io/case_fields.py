"""Reading a validation case's fields (shared/validation/SCHEMA.md): required paths, optional
keys, keywords as the schema spells them, and table lookups that leave unknown words to the
plan's own validation."""

from __future__ import annotations

from meshplan.errors import MeshplanError


def required(case: dict, path: str, where: str):
    """``case`` at the dotted ``path``, which the schema requires."""
    node = case
    for key in path.split("."):
        if not isinstance(node, dict) or node.get(key) is None:  # YAML's null is "not set"
            raise MeshplanError(f"{where}.{path}", None, "this field is required by the validation schema")
        node = node[key]
    return node


def word(value):
    """A keyword as the schema spells it: text stripped and lower-cased ("BF16", "SwiGLU"); other
    values as given."""
    return value.strip().lower() if isinstance(value, str) else value


def option(section: dict, key: str, default):
    """``section[key]``, or ``default`` where the key is absent or null (YAML's null is "not set":
    ``virtual_pipeline_stages: null`` is Megatron's None, no interleaving)."""
    value = section.get(key)
    return default if value is None else value


def lookup(table: dict, key, default):
    """``table[key]``, or ``default`` where the key is not there or cannot be (a list or a mapping
    where the schema wants a word: the plan's validation then names the field and its values)."""
    try:
        return table.get(key, default)
    except TypeError:
        return default
