"""The third-party private APIs the library depends on, one small module per upstream.

Each function here wraps one API that the pinned version exposes only privately and that
has no public equivalent fit for the job (the docstring says why, and what was measured
or tried). Nothing else in the package touches a private name of pyarrow, pyiceberg or
torch, and ``tests/upstream/`` exercises every wrapper against the installed library, so
an upgrade that changes one fails there, by name, rather than deep inside a read.
"""
