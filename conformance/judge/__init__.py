"""Judging: a kernel's outputs against the definition and its TOL-2 bound, property by property.

Owns: the judge's view of a kernel (``kernel``, ``kernel_info``), the bounds and assertions
(``bounds``, ``assertions``, ``statistics``, ``favor_bound``), failures and verdicts
(``failures``, ``verdict``), the properties (``registration``, ``properties/``, ``registry``),
hints (``convention_hints``, ``exception_hints``), the probes that diagnose root causes
(``diagnosis``) and reproductions (``reproduce``).

May import: draw, kernels.
"""
