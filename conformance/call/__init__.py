"""Calling a kernel: the inputs of one attention call and the conventions a kernel is called in.

Owns: :class:`~.problem.Problem` (one call's inputs as float64 NumPy), input layouts and
argument renames (``layouts``), keeping what a kernel prints off the report
(``side_effects``).  This is the part of the suite that runs in the kernel's own process.

May import: claims.
"""
