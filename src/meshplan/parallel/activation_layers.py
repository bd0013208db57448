"""Layers of a role that handle their activations otherwise than their kind's: the first
trained layers offloaded to host memory (Plan.activation_offload_layers), or, under whole-layer
recompute of some layers only (Plan.recompute_layers), the later ones keeping theirs. Each moves
to a variant of its kind, so a role's cost still grows with its layer kinds, not its layers."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshplan.parallel.program import LayerKind


def offloaded_counts(counts: tuple, layers: int, kinds: dict[str, LayerKind]) -> tuple:
    """``counts`` with the first ``layers`` trained layers moved to offloaded kinds (added to
    ``kinds``: the same layer, its saved activations in host memory), in layer order. Only trained
    layers keep activations to offload; Megatron-Core offloads fewer layers than the model has,
    so a stage keeps at least one layer on the device."""
    left = min(layers, sum(n - f for _, n, f in counts) - 1)
    out = []
    for name, n, frozen in counts:
        moved = max(0, min(left, n - frozen))
        left -= moved
        if n - moved:
            out.append((name, n - moved, frozen))
        if moved:
            offloaded = f"{name} offloaded"
            kinds.setdefault(offloaded, replace(kinds[name], name=offloaded, offloaded=True))
            out.append((offloaded, moved, 0))
    return tuple(out)


def kept_counts(counts: tuple, recomputed: int, kinds: dict[str, LayerKind]) -> tuple:
    """``counts`` with the trained layers after the first ``recomputed`` moved to kinds that keep
    their activations (added to ``kinds``: the same layer, nothing re-run), in layer order
    (Plan.recompute_layers; Megatron-Core's block method recomputes the first layers)."""
    left = recomputed
    out = []
    for name, n, frozen in counts:
        stays = min(left, n - frozen)
        left -= stays
        kept = n - frozen - stays
        if n - kept:
            out.append((name, n - kept, frozen))
        if kept:
            name_kept = f"{name} kept"
            kind = kinds[name]
            kinds.setdefault(name_kept, replace(kind, name=name_kept, recompute_ops=(), saved_bytes=kind.full_saved_bytes, recomputed=False))
            out.append((name_kept, kept, 0))
    return tuple(out)
