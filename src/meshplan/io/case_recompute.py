"""How a validation case says what its decoder layers recompute: the schema's
activation_recompute word, and the extra keys runs carry (SCHEMA.md keeps them): Megatron-Core's
recompute modules and block method, MaxText's remat policy, torchtitan's layer checkpointing
and fms-fsdp's share of checkpointed blocks."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from meshplan.errors import MeshplanError
from meshplan.io.case_fields import lookup, option, word
from meshplan.io.case_words import RECOMPUTE_FLAGS, RECOMPUTE_WORDS, REMAT_POLICIES
from meshplan.io.recipes import name_key


def recompute_word(value):
    """activation_recompute: none | selective | full, or a yes/no flag (full or none); a word
    that goes on to say more ("selective (core attention)", "full, uniform") is its first word."""
    if isinstance(value, bool):
        return RECOMPUTE_FLAGS[value]
    text = word(value)
    if not isinstance(text, str):
        return text
    first = re.split(r"[\s(,;:]+", text, maxsplit=1)[0]
    return first if first in ("none", "selective", "full") else RECOMPUTE_WORDS.get(first, text)


def recompute_fields(par: dict, plan: dict, num_layers, where: str) -> None:
    """The recompute a case's parallelism keys set beyond activation_recompute, into ``plan``."""
    _recompute_layers(par, plan, num_layers, where)
    modules = option(par, "recompute_modules", None)
    if modules is not None and plan["recompute"] in ("none", "selective"):  # Megatron-Core reads them under selective granularity only
        plan.update(recompute="selective", selective_recompute="modules", recompute_modules=modules)
    remat = option(par, "remat_policy", None)
    if remat is not None:  # MaxText's name for its recompute policy
        known = lookup(REMAT_POLICIES, name_key(remat) if isinstance(remat, str) else remat, None)
        if known is None:
            raise MeshplanError(f"{where}.parallelism.remat_policy", remat, f"one of {', '.join(REMAT_POLICIES)} (MaxText's)")
        plan.update(recompute=known[0], selective_recompute=known[1])


def _recompute_layers(par: dict, plan: dict, num_layers, where: str) -> None:
    """Plan.recompute_layers from a case, each run's own way of recomputing some layers whole:
    meshplan's count; Megatron's block method (recompute_num_layers with recompute_method block,
    NeMo 1's activations_checkpoint_*; its uniform method re-runs every layer); torchtitan's
    layer checkpointing of every k-th block (selective_ac_option "k"); fms-fsdp's share p of the
    blocks (selective_checkpointing; fms_fsdp/policies/ac_handler.py checkpoints floor(p·L + 1/2)
    of L evenly spaced blocks, every one where p is 1). The last two count a model chunk's layers."""
    count = option(par, "recompute_layers", None)
    method = word(option(par, "recompute_method", par.get("activations_checkpoint_method")))
    block = option(par, "recompute_num_layers", par.get("activations_checkpoint_num_layers"))
    if count is None and method == "block":
        count = block
    every = str(word(option(par, "selective_ac_option", "")))  # torchtitan's: "op", or a layer frequency
    share = option(par, "selective_checkpointing", None)
    if count is None and (share is not None or every.isdigit()):
        if not isinstance(num_layers, int) or num_layers <= 0:
            return  # the model's own check names the layer count
        chunk = num_layers / _count(option(par, "pp", 1)) / _count(option(par, "virtual_pipeline_stages", 1))
        if share is not None:
            p = _fraction(share, f"{where}.parallelism.selective_checkpointing")
            count = math.floor(p * chunk + 0.5)
        else:
            count = math.ceil(chunk / max(int(every), 1))  # blocks 0, k, 2k, ... (torchtitan's layer AC)
        plan.update(recompute="selective", selective_recompute="blocks")
    if count is not None:
        plan["recompute_layers"] = count


def _fraction(value, field: str) -> float:
    """A share from 0 to 1, as a number or a ratio written "a/b" (fms-fsdp's "1/3")."""
    try:
        p = float(Fraction(value)) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, ZeroDivisionError):
        raise MeshplanError(field, value, "a share of the blocks from 0 to 1, as a number or a ratio like 1/3") from None
    if not 0.0 <= p <= 1.0:
        raise MeshplanError(field, value, "a share of the blocks from 0 to 1")
    return p


def _count(value) -> int:
    """A positive count as given, else 1 (the plan's own validation names a bad pp or vpp)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
