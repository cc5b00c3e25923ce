"""Thin, pure-convention adapters for well-known kernels (the conformance matrix's rows).

Each adapter only translates a library's convention into the spec's call (SDPA-1.1):
layout, the sense of a mask, a mask given as a function, a module's weights set to the
identity.  The numbers checked are the library's own.  Each carries its declaration, and
``attnspec.conformance.kernels.known.KNOWN_KERNELS`` maps the name a user types to it.
One module per library; importing one imports only its library.
"""
