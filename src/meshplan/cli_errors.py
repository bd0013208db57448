"""Click's and typer's usage errors (a bad flag value, an unknown option or command) as the one
``error:`` line every bad input gets."""

from __future__ import annotations

import sys

import typer


#: typer's conversions of flag values fail with pydantic's words; what would be valid, in ours
_FLAG_TYPES = (("valid integer", "a whole number"), ("valid number", "a number"), ("valid boolean", "true or false"))


def _flag_message(err: Exception) -> str | None:
    """``--tp: got 'abc'; a whole number`` for a flag whose value is not of its type, the value
    as last given on the command line (the one that counts); None for other usage errors."""
    param, message = getattr(err, "param", None), getattr(err, "message", "")
    valid = next((words for phrase, words in _FLAG_TYPES if phrase in str(message)), None)
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    if valid is None or not opts:
        return None
    given = None
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        if arg.startswith(f"{opts[0]}="):
            given = arg.split("=", 1)[1]
        elif arg == opts[0] and i + 1 < len(args):
            given = args[i + 1]
    return f"{opts[0]}: got {given!r}; {valid}" if given is not None else f"{opts[0]}: {valid}"


def usage_message(err: Exception) -> str:
    """One line for a click/typer usage error (bad option value, unknown option or command)."""
    message = _flag_message(err) or (err.format_message() if hasattr(err, "format_message") else str(err))
    message = " ".join(message.split())
    ctx = getattr(err, "ctx", None)
    if message and ctx is not None:
        message += f" (see `{ctx.command_path} --help`)"
    return message


def is_usage_error(err: Exception) -> bool:
    """Click's usage errors, without importing click: typer >= 0.26 raises those of its own
    vendored copy, older typer those of click itself."""
    return isinstance(err, typer.TyperException) or any(
        cls.__name__ in ("ClickException", "UsageError") for cls in type(err).__mro__
    )
