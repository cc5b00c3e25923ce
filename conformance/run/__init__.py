"""Running a check: properties under Hypothesis, in supervised worker processes.

Owns: running one property over its strata (``property_runner``), setting a kernel up
(``kernel_setup``), the supervisor and its worker processes (``supervisor``, ``worker``,
``worker_pool``), the re-runs that find each failure's root cause (``root_causes``) and
Hypothesis's draws kept to the seed (``hypothesis_constants``).

May import: judge.
"""
