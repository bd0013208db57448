"""Common ground for specs: frozen pydantic models and unit-aware number types."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from meshplan.errors import MeshplanError
from meshplan.units import parse_quantity


class Spec(BaseModel):
    """A frozen, validated input. Unknown keys are errors (a typo never passes silently), and so
    are NaN and infinite numbers (``.nan`` or ``.inf`` in YAML would turn every result into NaN)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)


def _quantity(kind: str):
    def parse(value: object) -> object:
        if isinstance(value, str):
            return parse_quantity(value, kind, field="")  # the path names the field
        return value

    return BeforeValidator(parse)


#: sizes and rates accept a number in SI units or a string with a unit; all must be > 0
Bytes = Annotated[float, _quantity("bytes"), Field(gt=0)]
BytesPerS = Annotated[float, _quantity("bytes_per_s"), Field(gt=0)]
FlopPerS = Annotated[float, _quantity("flop_per_s"), Field(gt=0)]
Seconds = Annotated[float, _quantity("s"), Field(ge=0)]
JoulesPerBit = Annotated[float, _quantity("j_per_bit"), Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
#: counts stop at 2**53, the largest integer a float holds exactly: every count ends up in float
#: arithmetic, and a larger one is a typo (or a fuzzer), not a cluster
MAX_COUNT = 2**53


def _number(value: object) -> object:
    """A count or a plain number is a number: ``true`` is not 1 and ``"8"`` not 8 (SCHEMA.md:
    numbers given as strings are not valid), which pydantic's lax numbers would take."""
    if isinstance(value, (bool, str)):
        raise ValueError("a number (not true/false or text)")
    return value


Count = Annotated[int, BeforeValidator(_number), Field(ge=1, le=MAX_COUNT)]
Natural = Annotated[int, BeforeValidator(_number), Field(ge=0, le=MAX_COUNT)]
#: a plain positive number without a unit (lookups per sample, bytes per parameter)
Positive = Annotated[float, BeforeValidator(_number), Field(gt=0)]


def build(cls: type[Spec], data: object, where: str):
    """Validate ``data`` as ``cls``; turn the first pydantic error into a MeshplanError.

    ``where`` prefixes the field path, e.g. ``plan`` gives ``plan.tp``.
    """
    if isinstance(data, cls):
        return data
    try:
        return cls.model_validate(data)
    except MeshplanError as err:  # raised from a validator with its own field name
        raise MeshplanError(f"{where}.{err.field}".strip("."), err.value, err.valid, hint=err.hint) from None
    except ValidationError as err:
        raise from_validation_error(err, where) from None


def _inner_path(where: str, loc: list[str], field: str) -> str:
    """The dotted path of the field a validator names (MeshplanError.field) at ``loc`` under
    ``where``. A field validator names its own field, alone or under its spec (``loc`` ends with
    it); a model validator names a field of its spec (``top_k`` of ``model.moe``), which the
    path keeps; a name that starts with ``where`` is whole."""
    if not field or (loc and (field == loc[-1] or field.endswith(f".{loc[-1]}"))):
        return ".".join(p for p in (where, *loc) if p)
    if where and (field == where or field.startswith(f"{where}.")):
        return field
    if loc and field.startswith(f"{loc[-1]}."):
        loc = loc[:-1]
    return ".".join(p for p in (where, *loc, field) if p)


def from_validation_error(err: ValidationError, where: str) -> MeshplanError:
    first = err.errors()[0]
    path = ".".join(str(p) for p in (where, *first["loc"]) if p != "")
    value = first.get("input")
    message = first["msg"]
    if first["type"] == "missing":
        return MeshplanError(path, None, "this field is required")
    if first["type"] == "extra_forbidden":
        return MeshplanError(path, value, "unknown field (check its spelling)")
    ctx = first.get("ctx") or {}
    inner = ctx.get("error")
    if isinstance(inner, MeshplanError):
        return MeshplanError(_inner_path(where, [str(p) for p in first["loc"]], inner.field), inner.value,
                             inner.valid, hint=inner.hint)
    return MeshplanError(path, value, _in_words(first["type"], ctx, message))


#: pydantic's error types (pydantic-core's ErrorType), said as what would be valid
_VALID = {
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "int_parsing_size": "a whole number of at most 2**53", "float_type": "a number", "float_parsing": "a number",
    "finite_number": "a finite number", "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "text", "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "list_type": "a list", "tuple_type": "a list",
}
#: bounds (Field ge/gt/le/lt and lengths): the context key each names, and how it reads
_BOUNDS = {
    "greater_than_equal": ("ge", "at least {}"), "greater_than": ("gt", "more than {}"),
    "less_than_equal": ("le", "at most {}"), "less_than": ("lt", "less than {}"),
    "too_short": ("min_length", "at least {} {}"), "too_long": ("max_length", "at most {} {}"),
}


def _in_words(kind: str, ctx: dict, message: str) -> str:
    """What would be valid, for a pydantic error of type ``kind``: plain words for the common
    types, the choices of a literal listed, and pydantic's own message otherwise."""
    if kind in _VALID:
        return _VALID[kind]
    if kind in _BOUNDS and _BOUNDS[kind][0] in ctx:
        key, words = _BOUNDS[kind]
        return words.format(ctx[key], "entry" if ctx[key] == 1 else "entries")  # a number bound ignores the second
    if kind == "literal_error" and "expected" in ctx:
        choices = str(ctx["expected"]).replace(" or ", ", ").replace("'", "")
        return f"one of {choices}"
    return message.removeprefix("Value error, ")
