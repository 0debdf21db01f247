"""The server's /metrics: a small default page and per-GPU shards (see ``pages.py``)."""
