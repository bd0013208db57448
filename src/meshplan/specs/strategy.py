"""Per-layer-kind hierarchical parallelization strategies (MAD Max Sec. 2.2, Insight 3).

Each layer kind (embedding, dense, transformer, moe) gets a tuple of strategies, one per network
level, innermost first: ``dense=(tp,ddp)`` is tensor parallelism inside the node (level 0) and
distributed data parallelism across nodes (level 1). A single entry spans every device. Order
matters: ``(ddp,tp)`` replicates inside the node and shards across nodes (MAD Max Insight 3).

- ``ddp``: replicate; all-reduce the weight gradients (non-blocking, behind backward compute);
- ``fsdp``: shard weights, gradients and optimizer states; all-gather weights before forward and
  backward, reduce-scatter gradients;
- ``tp``: shard each weight matrix; all-reduce activations (blocking);
- ``mp``: embeddings only, shard the tables; all-to-all of pooled embeddings and their gradients;
- ``ep``: moe only, shard the experts; all-to-all of the samples routed to them.

Written as ``"embedding=(mp) dense=(tp,ddp)"``, ``"embedding=mp dense=tp,ddp"`` or a mapping
``{"embedding": ["mp"], "dense": ["tp", "ddp"]}``. The default is MAD Max's default for DLRM:
embeddings model-parallel, dense layers data-parallel (``embedding=(mp) dense=(ddp)``).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import field_validator, model_validator

from meshplan.errors import MeshplanError
from meshplan.specs.base import Spec

StrategyName = Literal["ddp", "fsdp", "tp", "mp", "ep"]
LAYER_KINDS = ("embedding", "dense", "transformer", "moe")
STRATEGIES = ("ddp", "fsdp", "tp", "mp", "ep")

#: which strategies each layer kind accepts
ALLOWED: dict[str, tuple[str, ...]] = {
    "embedding": ("mp", "ddp"),
    "dense": ("ddp", "fsdp", "tp"),
    "transformer": ("ddp", "fsdp", "tp"),
    "moe": ("ep", "ddp", "fsdp", "tp"),
}

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_GROUP = re.compile(
    rf"\s*(?P<kind>{_NAME})\s*=\s*(?:\((?P<paren>[^()]*)\)|(?P<bare>{_NAME}(?:\s*,\s*{_NAME}(?!\s*=))*))\s*[,;]?"
)
EXAMPLE = "e.g. 'embedding=(mp) dense=(tp,ddp)'"


class Strategy(Spec):
    """Per-layer-kind strategies, innermost network level first (see the module docstring)."""

    embedding: tuple[StrategyName, ...] = ("mp",)
    dense: tuple[StrategyName, ...] = ("ddp",)
    transformer: tuple[StrategyName, ...] | None = None  # None: as dense
    moe: tuple[StrategyName, ...] | None = None  # None: (ep, ddp), experts split inside the node

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data: object) -> object:
        if isinstance(data, str):
            return parse_strategy_text(data)
        if isinstance(data, dict):
            unknown = [k for k in data if k not in LAYER_KINDS]
            if unknown:
                raise MeshplanError("strategy", unknown[0], f"unknown layer kind; one of {', '.join(LAYER_KINDS)}")
            return {k: _entries(k, v) for k, v in data.items()}
        return data

    @field_validator("embedding", "dense", "transformer", "moe")
    @classmethod
    def _allowed(cls, value, info):
        if value is None:
            return value
        kind = info.field_name
        if not value:
            raise MeshplanError(f"strategy.{kind}", value, f"give at least one of {', '.join(ALLOWED[kind])}")
        for name in value:
            if name not in ALLOWED[kind]:
                raise MeshplanError(f"strategy.{kind}", name, f"{kind} layers take {', '.join(ALLOWED[kind])}")
        if len(set(value)) != len(value):
            raise MeshplanError(
                f"strategy.{kind}", "(" + ",".join(value) + ")",
                "a strategy appears twice; one entry per network level, and a single entry spans every device",
            )
        return value

    def of(self, kind: str) -> tuple[str, ...]:
        """The strategy tuple of a layer kind (transformer layers follow dense unless given)."""
        if kind == "transformer" and self.transformer is None:
            return self.dense
        return getattr(self, kind)

    @property
    def label(self) -> str:
        """``embedding=(mp) dense=(tp,ddp)``: the canonical text form."""
        parts = [f"embedding=({','.join(self.embedding)})", f"dense=({','.join(self.dense)})"]
        for kind in ("transformer", "moe"):
            if getattr(self, kind) is not None:
                parts.append(f"{kind}=({','.join(getattr(self, kind))})")
        return " ".join(parts)


def _entries(kind: str, value: object) -> tuple[str, ...]:
    """``"tp,ddp"``, ``"(tp, ddp)"``, ``["tp", "ddp"]`` -> ("tp", "ddp"); unknown names are errors."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("(") and text.endswith(")"):
            text = text[1:-1]
        names = [w.strip() for w in text.split(",") if w.strip()]
    elif isinstance(value, (list, tuple)):
        names = [str(w).strip() for w in value]
    else:
        raise MeshplanError(f"strategy.{kind}", value, f"a list of strategies, {EXAMPLE}")
    for name in names:
        if name.lower() not in STRATEGIES:
            raise MeshplanError(f"strategy.{kind}", name, f"unknown strategy; {kind} layers take {', '.join(ALLOWED[kind])}")
    return tuple(n.lower() for n in names)


def parse_strategy_text(text: str) -> dict[str, tuple[str, ...]]:
    """Parse ``"embedding=(mp) dense=(tp,ddp)"`` into a mapping; the whole string must parse."""
    out: dict[str, tuple[str, ...]] = {}
    position = 0
    stripped = text.rstrip()
    if not stripped.strip():
        raise MeshplanError("strategy", text, f"an empty strategy; {EXAMPLE}")
    while position < len(stripped):
        match = _GROUP.match(stripped, position)
        if not match or match.end() == position:
            raise MeshplanError("strategy", text, f"malformed at {stripped[position:]!r}; expected KIND=(s1,s2,...), {EXAMPLE}")
        kind = match.group("kind").lower()
        if kind not in LAYER_KINDS:
            raise MeshplanError("strategy", match.group("kind"), f"unknown layer kind; one of {', '.join(LAYER_KINDS)}")
        if kind in out:
            raise MeshplanError("strategy", kind, "this layer kind is given twice")
        entries = match.group("paren") if match.group("paren") is not None else match.group("bare")
        out[kind] = _entries(kind, entries)
        position = match.end()
    return out
