"""Time of the reference's recurrences (spec/recurrent.md): the chunked WY / UT form against
the token recurrence and against a naive chunked form that solves each chunk on its own.

The chunked form's cost is in Python-level steps as much as in arithmetic: the token
recurrence takes T steps, a chunked form that solves each chunk alone T steps too (c rows of
forward substitution per chunk), and the reference's form c + T/c + (rows per slab) steps,
because it solves the chunk-local systems of a whole slab of chunks at once.  Run
``python -m attnspec.benchmarks.recurrent`` (``--help`` for sizes); it prints one row per
size and form, the best of ``--repeat`` runs, and checks that the forms agree.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends import Backend
from ..reference.recurrent import recurrent_attention
from ..reference.recurrent._inputs import prepare
from ..reference.recurrent.chunked import chunked_recurrence

FORMS = ("token", "chunked", "naive-chunked")


def _problem(
    backend: Backend, length: int, heads: int, dim: int, per_channel: bool
) -> dict[str, Any]:
    """Unit keys, weak decay, beta in (0, 1): a realistic gated delta rule problem."""
    rng = np.random.default_rng(0)
    k = rng.standard_normal((1, heads, length, dim))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    gate_shape = (1, heads, length, dim) if per_channel else (1, heads, length)
    arrays = {
        "q": rng.standard_normal((1, heads, length, dim)),
        "k": k,
        "v": rng.standard_normal((1, heads, length, dim)),
        "g": -0.05 * rng.random(gate_shape),
        "beta": rng.random((1, heads, length)),
    }
    return {name: backend.asarray(a, "float32") for name, a in arrays.items()}


def _runner(form: str, problem: dict[str, Any], chunk: int) -> Callable[[], Any]:
    if form == "token":
        return lambda: recurrent_attention(**problem).out
    if form == "chunked":
        return lambda: recurrent_attention(**problem, chunk_size=chunk).out
    prepared = prepare(
        problem["q"], problem["k"], problem["v"], "benchmark", g=problem["g"], beta=problem["beta"]
    )
    return lambda: chunked_recurrence(prepared, chunk, slab_chunks=1)[0]


def best_time(fn: Callable[[], Any], backend: Backend, repeat: int) -> tuple[float, Any]:
    """The shortest of ``repeat`` wall times (seconds), after one warm-up call."""
    result = backend.to_numpy(fn())
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        backend.to_numpy(fn())
        best = min(best, time.perf_counter() - start)
    return best, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-channel", action="store_true")
    args = parser.parse_args(argv)
    backend = Backend(args.backend)
    print(
        f"backend={args.backend} heads={args.heads} d={args.dim} chunk={args.chunk} "
        f"gates={'per channel' if args.per_channel else 'per head'} float32"
    )
    print(f"{'T':>6} {'form':>14} {'seconds':>9} {'vs token':>9} {'max |diff|':>11}")
    for length in (int(t) for t in args.lengths.split(",")):
        problem = _problem(backend, length, args.heads, args.dim, args.per_channel)
        times, results = {}, {}
        for form in FORMS:
            times[form], results[form] = best_time(
                _runner(form, problem, args.chunk), backend, args.repeat
            )
        for form in FORMS:
            diff = np.max(np.abs(np.asarray(results[form]) - np.asarray(results["token"])))
            speedup = times["token"] / times[form]
            print(f"{length:>6} {form:>14} {times[form]:>9.3f} {speedup:>8.1f}x {diff:>11.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
