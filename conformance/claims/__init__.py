"""Claims: what the spec says and what a kernel claims of itself.

Owns: the spec's clause ids read from ``spec/*.md`` (``clauses``), a kernel's
:class:`~.declaration.KernelDeclaration` (``declaration``; the values each field may hold:
``validation``; the sparse, linear, RoPE and merge claims: ``family_claims``), the claims table
(``table``) with its command-line flags (``flags``), reading a claim string back
(``claim_string``) and loading a ``MODULE:FUNC`` target (``loading``).

May import: reference, _version.
"""
