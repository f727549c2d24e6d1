"""The command line's tools, one module per command (``cli.py`` only parses arguments).

Each is built on the loader's own discovery, planning and reading:

* :mod:`.plan`: which chunks every rank and worker reads (summary, detail, JSON, picture);
* :mod:`.inspect`: what a dataset is made of, and the split size to use;
* :mod:`.simulate`: predicted time to first batch and epoch time from a storage model;
* :mod:`.reshard`: rewrite a dataset into balanced Parquet shards with a manifest;
* :mod:`.demo`: the README's main job as real ranks.
"""
