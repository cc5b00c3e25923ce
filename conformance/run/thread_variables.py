"""The environment variables that size a worker's thread pools: the supervisor sets them
for each worker it starts, and a worker (or a kernel's own process) reads them.  Apart from
both, so that a kernel's own process reads them without importing the supervisor and,
with it, Hypothesis and every property (~0.15 s of CPU a process, issue 33)."""

from __future__ import annotations

# The variables BLAS and OpenMP libraries (OpenBLAS, MKL, Accelerate, PyTorch's intra-op
# pool, numexpr) size their thread pools from when they load.  Left unset, each of N
# workers starts one thread per core: N x cores threads on cores shared with the other
# workers (PyTorch's quick profile ran 2-3x slower so on this project's 2-core machine).
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
# How a worker learns the count its supervisor chose (to apply to PyTorch and report it).
WORKER_THREADS = "ATTNSPEC_WORKER_THREADS"
