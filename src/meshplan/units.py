"""Human quantities ("900 GB/s", "80 GiB", "312 TFLOP/s", "2 us") parsed once, at the boundary.

Inside meshplan every number is an SI float whose unit is in its name (DESIGN.md, Numbers).
GB is 1e9 bytes and GiB is 2**30 bytes; "Gb" (lower-case b) is bits.
"""

from __future__ import annotations

import math
import numbers
import re

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

_NUMBER = r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_PATTERN = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>\S*)\s*$")

#: what each kind of quantity accepts, for error messages
KINDS = {
    "bytes": "a size such as '80 GB', '80 GiB' or '512 MiB'",
    "bytes_per_s": "a bandwidth such as '900 GB/s', '400 Gb/s' or '1.5 TB/s'",
    "flop_per_s": "a rate such as '312 TFLOP/s' or '1.9 PFLOP/s'",
    "s": "a time such as '2 us', '1.5 ms' or '3 s'",
    "j_per_bit": "an energy such as '5 pJ/bit'",
}


def _scale(prefix: str) -> float | None:
    if prefix in _BINARY:
        return _BINARY[prefix]
    return _PREFIX.get(prefix)


def _parse_unit(unit: str, kind: str) -> float | None:
    """Multiplier that turns ``unit`` into the SI unit of ``kind``; None if it does not fit."""
    if kind == "bytes":
        if unit.endswith("B"):
            return _scale(unit[:-1])
        return None
    if kind == "bytes_per_s":
        if unit.endswith("B/s"):
            return _scale(unit[:-3])
        if unit.endswith("b/s"):  # bits per second
            s = _scale(unit[:-3])
            return None if s is None else s / 8.0
        if unit.endswith("bps"):
            s = _scale(unit[:-3])
            return None if s is None else s / 8.0
        return None
    if kind == "flop_per_s":
        for suffix in ("FLOP/s", "FLOPS", "flop/s"):
            if unit.endswith(suffix):
                return _scale(unit[: -len(suffix)])
        return None
    if kind == "s":
        return _TIME.get(unit)
    if kind == "j_per_bit":
        energy = {"J/bit": 1.0, "mJ/bit": 1e-3, "uJ/bit": 1e-6, "nJ/bit": 1e-9, "pJ/bit": 1e-12, "fJ/bit": 1e-15}
        return energy.get(unit)
    raise KeyError(kind)


def parse_quantity(value: object, kind: str, field: str = "value") -> float:
    """Parse ``value`` (a number already in SI units, or a string with a unit) into a float.

    A string must carry a unit: "900" for a bandwidth is ambiguous and rejected.
    """
    from meshplan.errors import MeshplanError

    if isinstance(value, bool):
        raise MeshplanError(field, value, f"expected {KINDS[kind]}")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise MeshplanError(field, value, f"expected {KINDS[kind]}")
    match = _PATTERN.match(value)
    if not match or not match.group("unit"):
        raise MeshplanError(field, value, f"expected {KINDS[kind]} (a unit is required)")
    scale = _parse_unit(match.group("unit"), kind)
    if scale is None:
        raise MeshplanError(field, value, f"unknown unit {match.group('unit')!r}; expected {KINDS[kind]}")
    return float(match.group("num")) * scale


#: a difference of floats this small relative to its operands is rounding noise, not a quantity
NOISE = 1e-9


def difference(a: float, b: float, floor: float | None = None) -> float:
    """``a - b`` with rounding noise (below ``NOISE`` relative to the larger operand) set to
    exactly 0.0, never -0.0; with ``floor``, never below it (a time that cannot be negative)."""
    d = a - b
    if abs(d) <= NOISE * max(abs(a), abs(b)):
        d = 0.0
    if floor is not None:
        d = max(d, floor)
    return d + 0.0  # -0.0 + 0.0 is 0.0


_BINARY_UNITS = (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10))


def format_bytes(n: float, unit: str | None = None) -> str:
    """'79.6 GiB' style: memory is printed in binary units, as nvidia-smi and the catalog state
    device memory (an "80GB" A100 holds 80 GiB = 85.9e9 bytes). ``unit`` fixes the unit, so that
    two sizes compared in one message read in the same one."""
    if unit is not None:
        scale = dict(_BINARY_UNITS)[unit]
        return f"{n / scale:,.1f} {unit}"
    for name, scale in _BINARY_UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.3g} {name}"
    return f"{n:.0f} B"


def format_devices(num_devices: int, cluster_id: str) -> str:
    """'1536 devices of dgx-a100-80gb'."""
    return f"{num_devices} device{'' if num_devices == 1 else 's'} of {cluster_id}"


def format_seconds(t: float) -> str:
    t += 0.0  # never print -0
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(t) >= scale:
            return f"{t / scale:.4g} {unit}"
    if t == 0.0:
        return "0 s"
    return f"{t * 1e9:.3g} ns"


def format_energy(joules: float) -> str:
    """'12.3 kJ', '4.56 MWh': joules up to MJ, then watt-hours (how training energy is reported)."""
    if abs(joules) >= 3.6e9:
        mwh = joules / 3.6e9
        return f"{mwh:,.0f} MWh" if abs(mwh) >= 100 else f"{mwh:.3g} MWh"
    for unit, scale in (("MJ", 1e6), ("kJ", 1e3)):
        if abs(joules) >= scale:
            return f"{joules / scale:.3g} {unit}"
    return f"{joules:.3g} J"


def finite_number(value: object) -> bool:
    """Whether ``value`` is a real number (Python's or numpy's, not a boolean) that a float holds
    finitely: not NaN or infinite, and not an int too large for a float (10**400)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
