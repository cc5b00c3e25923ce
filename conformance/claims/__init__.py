"""Claims: what the spec says and what a kernel claims of itself.

Owns: the spec's clause ids read from ``spec/*.md`` (``clauses``), the claims table with its
flags and claim strings (``table``), a kernel's :class:`~.declaration.KernelDeclaration`
(``declaration``) and loading a ``MODULE:FUNC`` target (``loading``).

May import: reference, _version.
"""
