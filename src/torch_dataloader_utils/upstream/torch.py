"""torch: a shared-memory byte buffer without a copy.

The public ``torch.empty(n, dtype=torch.uint8).share_memory_()`` allocates ordinary
memory and then copies it into a new shared segment. For the ~8 MiB buffers a worker
fills with a group of batches, that copy doubled the cost of the allocation (2.1 ms ->
4.5 ms per 8 MiB on the project's machine, torch 2.13.0), on every transfer.
``UntypedStorage._new_shared`` allocates the shared segment directly.
"""

from __future__ import annotations

import torch

__all__ = ["new_shared_bytes"]


def new_shared_bytes(nbytes: int) -> torch.Tensor:
    """A 1-d ``uint8`` tensor of ``nbytes`` bytes in shared memory (contents undefined)."""
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call]
    except (AttributeError, RuntimeError):  # the private API is gone: the public path, one copy more
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()  # type: ignore[no-untyped-call,no-any-return]
    return torch.empty(0, dtype=torch.uint8).set_(storage)
