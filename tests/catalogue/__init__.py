"""A catalogue of attention kernels that proves the conformance suite works (CONF-1).

``catalogue.correct.CORRECT``: independently written correct kernels the suite must
pass on every applicable property.  ``catalogue.buggy.CATALOGUE``: kernels with exactly
one realistic bug each, and the property expected to catch it.
"""
