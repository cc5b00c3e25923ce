"""The reference's entry point, ``scaled_dot_product_attention``: one function, two forms.

Both forms compute the function spec/dense.md and spec/features.md define, with the same
checks, errors, zeros, NaNs and infinities: the plain form (:func:`~.sdpa.plain_attention`)
holds every ``Lq x Lk`` score at once, the blocked form (:func:`~.blocked.blocked_attention`)
a block of them at a time, within TOL-2 of it (TOL-5 for the log-sum-exp).  The entry
point takes the blocked form, which is several times faster and runs in O(Lq + Lk) extra
memory, whenever the call asks for nothing of size ``Lq x Lk``: the weights
(``return_weights``) and dropout (its keep mask) are the plain form's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._array import Array
from ._checks import check_flag, namespace_of
from .blocked import blocked_form
from .features import check_dropout_p
from .options import AttentionOptions, BlockedOptions, filled, shows_options
from .sdpa import CALL, plain_form

if TYPE_CHECKING:
    from typing import Unpack


@shows_options(AttentionOptions)
def scaled_dot_product_attention(
    q: Array, k: Array, v: Array, **given: Unpack[AttentionOptions]
) -> Any:
    """Attention as spec/dense.md and spec/features.md define it.

    ``q (..., Hq, Lq, E)``, ``k (..., Hkv, Lk, E)``, ``v (..., Hkv, Lk, Ev)`` with
    ``Hq = G * Hkv`` (SDPA-6.1) give ``(..., Hq, Lq, Ev)`` in q's dtype (SDPA-1.3).
    ``mask`` is boolean, True = may attend (SDPA-3.1); ``bias`` is added after scaling
    (SDPA-3.2) and loses to the mask (SDPA-3.3); ``is_causal`` uses ``causal_alignment``
    (SDPA-4).  Rows with no allowed key give 0 (SDPA-5).

    ``softcap`` caps the scaled dot products to ``softcap * tanh(x / softcap)`` before the
    bias is added (SOFTCAP-1); ``alibi_slopes`` ``(..., Hq)`` adds ``-m_h |i + d - j|``
    with d the offset of ``causal_alignment`` (ALIBI-2); ``dropout_keep`` (boolean,
    broadcasting to the weights) keeps weights, rescaled by ``1 / (1 - dropout_p)``
    (DROP-2).  Returns ``out``, or a tuple ``(out, weights)``, ``(out, lse)`` or
    ``(out, weights, lse)``: weights ``(..., Hq, Lq, Lk)`` in q's dtype (after dropout),
    lse ``(..., Hq, Lq)`` in the accumulation dtype (LSE-1 … LSE-3).

    Computed block by block in O(Lq + Lk) extra memory (``blocked.py``) unless weights or
    dropout are asked for, which take the plain form (``sdpa.plain_attention``).
    """
    # the plain form's first checks, in its order, so both forms fail alike
    options = filled(AttentionOptions, given)
    check_flag("return_weights", options["return_weights"], CALL)
    check_flag("return_lse", options["return_lse"], CALL)
    dropout_keep = options["dropout_keep"]
    namespace_of(CALL, q=q, alibi_slopes=options["alibi_slopes"], dropout_keep=dropout_keep)
    if (
        options["return_weights"]
        or dropout_keep is not None
        or check_dropout_p(options["dropout_p"], CALL) > 0
    ):
        return plain_form(q, k, v, options, CALL)
    return blocked_form(q, k, v, filled(BlockedOptions, options), CALL)
