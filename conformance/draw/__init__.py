"""Drawing problems: the inputs each property checks a kernel on.

Owns: the sizes drawn (small strata that shrink, realistic strata of the sizes tiled
kernels special-case: ``sizes``), fixed anchor problems (``anchors``), realistic and small
values (``realistic_values``, ``small_values``), shape pools for backends that compile per
shape (``shape_pool``, ``seeded``, ``one_example``), the input features each clause governs
(``input_features``) and the Hypothesis strategies (``strategies``).  It sees the kernel only
as a :class:`~.target.DrawTarget`: its claims and dtypes.

May import: call.
"""
