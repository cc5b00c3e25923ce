"""Argument checks shared by the reference functions.

Every failure names the argument, what it was and what the spec expects, and cites the
clause, so a user never sees a traceback from inside an array library.
"""

from __future__ import annotations

import math
import operator
from types import ModuleType
from typing import Any

import array_api_compat


def namespace_of(call: str, **arrays: Any) -> ModuleType:
    """The one Array API namespace shared by all non-None ``arrays``."""
    present = {name: a for name, a in arrays.items() if a is not None}
    for name, a in present.items():
        if not array_api_compat.is_array_api_obj(a):
            raise TypeError(f"{name} is a {type(a).__name__}, but should be an array [{call}]")
    try:
        return array_api_compat.array_namespace(*present.values())
    except TypeError:
        libraries = ", ".join(
            f"{name}: {type(a).__module__}.{type(a).__name__}" for name, a in present.items()
        )
        raise TypeError(
            f"arrays from different libraries were mixed ({libraries}); pass arrays of "
            f"one library [{call}]"
        ) from None


def require_real_floating(xp: ModuleType, call: str, clause: str, **arrays: Any) -> None:
    for name, a in arrays.items():
        if a is not None and not xp.isdtype(a.dtype, "real floating"):
            raise TypeError(
                f"{name}.dtype={a.dtype}, but should be a real floating dtype "
                f"(float16, bfloat16, float32, float64) [{clause}, {call}]"
            )


def require_ndim_at_least(call: str, clause: str, minimum: int, layout: str, **arrays: Any) -> None:
    for name, a in arrays.items():
        if a.ndim < minimum:
            raise ValueError(
                f"{name}.shape={tuple(a.shape)}, but should have at least {minimum} dims "
                f"laid out as {layout} [{clause}, {call}]"
            )


def broadcast_shapes(call: str, clause: str, **shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Broadcast shapes by the Array API rules, naming the arguments on failure."""
    ndim = max((len(s) for s in shapes.values()), default=0)
    result = [1] * ndim
    for position in range(1, ndim + 1):
        for s in shapes.values():
            if position <= len(s):
                size = s[-position]
                if size != 1:
                    if result[-position] not in (1, size):
                        described = ", ".join(f"{n}{tuple(s)}" for n, s in shapes.items())
                        raise ValueError(
                            f"batch shapes do not broadcast: {described} [{clause}, {call}]"
                        )
                    result[-position] = size
    return tuple(result)


def require_broadcastable_to(
    name: str, shape: tuple[int, ...], target: tuple[int, ...], call: str, clause: str
) -> None:
    ok = len(shape) <= len(target) and all(
        s in (1, t) for s, t in zip(shape[::-1], target[::-1], strict=False)
    )
    if not ok:
        raise ValueError(
            f"{name}.shape={tuple(shape)}, but should broadcast to {tuple(target)} "
            f"[{clause}, {call}]"
        )


def real_number(name: str, value: Any, expected: str, clause: str, call: str) -> float:
    """``value`` as a float: a real number, 0-d arrays and NumPy scalars included, but not
    a bool or a string, which float() would accept; else a TypeError saying ``expected``."""
    if not isinstance(value, (bool, str, bytes)):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{name}={value!r}, but should be {expected} [{clause}, {call}]")


def check_scale(scale: Any, call: str) -> float | None:
    if scale is None:
        return None
    value = real_number("scale", scale, "None or a real number", "SDPA-2.2", call)
    if not math.isfinite(value):
        raise ValueError(f"scale={scale!r}, but should be finite [SDPA-2.2, {call}]")
    return value


def check_choice(name: str, value: Any, choices: tuple[str, ...], call: str, clause: str) -> str:
    if value not in choices:
        raise ValueError(
            f"{name}={value!r}, but should be one of {', '.join(map(repr, choices))} "
            f"[{clause}, {call}]"
        )
    return str(value)


def check_flag(name: str, value: Any, call: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r}, but should be True or False [{call}]")
    return value


def check_size(name: str, value: Any, call: str, *, minimum: int = 0) -> int:
    try:
        size = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r}, but should be an int >= {minimum} [{call}]") from None
    if isinstance(value, bool) or size < minimum:
        raise ValueError(f"{name}={value!r}, but should be an int >= {minimum} [{call}]")
    return size
