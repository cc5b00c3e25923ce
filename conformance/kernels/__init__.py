"""Known kernels: the library kernels of the conformance matrix and their declarations.

Owns: the table of known kernels and their confirmed divergences (``known``), PyTorch's SDPA
pinned to one backend (``torch_sdpa``), ``jax.nn.dot_product_attention`` under ``jax.jit``
(``jax_jitted``), a known kernel's signature written from its convention's names
(``convention``), and the thin pure-convention adapters of other libraries (``adapters/``).

May import: call.
"""
