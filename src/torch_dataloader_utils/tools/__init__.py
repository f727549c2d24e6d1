"""Offline tools built on the loader's own discovery, planning and reading (``reshard``...)."""
