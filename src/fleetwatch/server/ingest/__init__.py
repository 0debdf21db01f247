"""Ingest: a pushed batch from the wire to the store.

Decoding and wire structs (``batch_decoder``, ``batch_structs``, ``wire_time``), the checks on
what a batch holds (``checks``), storing one batch atomically (``store``, with its samples as
blocks: ``sample_writer``), and on PostgreSQL many routine batches in one transaction
(``group_store``, fed by the ``group_writer`` thread). ``routers/ingest.py`` is the HTTP route
that calls into it; the blocks' format (``db/sample_blocks.py``) is shared with the readers.
"""
