"""The one error type users see: it names the field, the value and what would be valid."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class MeshplanError(ValueError):
    """A bad input. ``field`` is a dotted path (``plan.tp``), ``valid`` says what would be accepted."""

    def __init__(self, field: str, value: object, valid: str, *, hint: str | None = None):
        self.field = field
        self.value = value
        self.valid = valid
        self.hint = hint
        message = f"{one_line(field)}: got {one_line(repr(value), VALUE_CHARS)}; {one_line(valid)}"
        if hint:
            message += f" ({one_line(hint)})"
        super().__init__(message)

    def __reduce__(self):
        """Rebuilt from its parts, so an error raised in a worker process comes back whole."""
        return (_rebuild, (type(self), self.field, self.value, self.valid, self.hint))


def _rebuild(cls, field, value, valid, hint):
    return cls(field, value, valid, hint=hint)


#: a value longer than this is cut in the message (a whole file's contents helps nobody)
VALUE_CHARS = 200


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` as one printable line: control characters escaped, cut at ``limit`` characters."""
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The closest known ids to ``name``, best first (for 'did you mean' hints)."""
    choices = list(choices)
    found = difflib.get_close_matches(name, choices, n=n, cutoff=0.4)
    if not found:
        found = [c for c in choices if name.lower() in c.lower()][:n]
    return found


def unknown_id(field: str, name: str, choices: Iterable[str]) -> MeshplanError:
    """An error for an id that is not in the catalog, suggesting the closest ones."""
    choices = sorted(choices)
    near = closest(name, choices)
    hint = f"did you mean {', '.join(near)}?" if near else None
    return MeshplanError(field, name, f"known ids: {', '.join(choices)}", hint=hint)
