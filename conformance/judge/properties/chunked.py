"""CHUNK-1: chunked local attention in a dense call, ``attention_chunk=C`` as FlashAttention 3
takes it (Llama 4's local layers).

Problems are drawn as for the dense properties (masks, bias, causal calls of the declared
alignment, GQA, explicit scales, the softcap and ALiBi where declared) with ``Lq != Lk`` in
most draws, and the kernel gets a chunk of 1 position to past the last key on top of the
problem's own arguments.  The chunk is a mask: the output must be within TOL-2 of the dense
definition with CHUNK-1's allowed set, at the declared alignment's query positions, joined to
the problem's mask.  The problem carries the chunk (``Problem.chunk``), so a reproduction calls
the kernel with ``attention_chunk=`` and compares with the chunked definition.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ...draw.strategies import draw_problem
from ..assertions import assert_matches_reference
from ..kernel import KernelUnderTest
from ..registration import needs, register

# chunks that tiled kernels meet at realistic sizes (a tile boundary inside or outside a chunk)
REALISTIC_CHUNKS = (16, 64, 128, 256)


@register("chunk-matches-reference", "CHUNK-1", applies=needs("chunk"))
def chunk_matches_reference(kernel: KernelUnderTest, data: st.DataObject) -> None:
    """With masks, bias, causal calls of the declared alignment, GQA, explicit scales and the
    declared softcap, a chunk of 1 to Lk + 1 positions gives an output within TOL-2 of the
    definition with CHUNK-1's allowed set: chunks counted from the query index instead of
    its key position t_i (seen when Lq != Lk under bottom-right alignment), a chunk dropped
    in causal calls, or a chunk without the causal bound inside it, are outside it."""
    problem = draw_problem(data, kernel)
    n_keys = problem.k.shape[-2]
    chunk = data.draw(
        st.one_of(st.integers(1, n_keys + 1), st.sampled_from(REALISTIC_CHUNKS)),
        label="attention_chunk",
    )
    assert_matches_reference(
        kernel, problem.with_(chunk=chunk), what=f"out with attention_chunk={chunk} [CHUNK-1]"
    )
