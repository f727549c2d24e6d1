"""The command line's tools, one module per command (``cli.py`` only parses arguments).

* :mod:`.plan`: which chunks every rank and worker reads (summary, detail, JSON, picture);
* :mod:`.inspect`: what a dataset is made of, and the split size to use;
* :mod:`.simulate`: predicted time to first batch and epoch time from a storage model;
* :mod:`.demo`: the README's main job as real ranks.
"""
