"""Support code shared by tests/ and benchmarks/ (never installed with the library).

tests/ and benchmarks/ never import each other; what both need lives here:

- :mod:`testsupport.latency_fs`: ``latency://``, an fsspec filesystem adding a fixed delay
  to every request and counting requests and bytes.
- :mod:`testsupport.s3_server`: starting a real S3 server on 127.0.0.1 (SeaweedFS, else moto).
- :mod:`testsupport.iceberg_tables`: SQLite-backed Iceberg catalogs and the position /
  equality delete-file writers (private pyiceberg APIs; pyiceberg is pinned).
- :mod:`testsupport.demo_iceberg`: the Iceberg demo of ``make demo``
  (``python -m testsupport.demo_iceberg``).

It is importable from the repository root (pytest's ``pythonpath = ["src", "."]``;
benchmarks run with ``PYTHONPATH=src:.``). It may import the library, never tests/ or
benchmarks/ (tests/test_repo_layout.py checks that).
"""
