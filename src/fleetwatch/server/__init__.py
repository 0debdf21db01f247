"""The central service, by stage.

- web layer, here: the app factory (``app.py``), request dependencies, auth, error handling, the
  fleet page, ``routers/`` (one per resource), ``schemas/``, ``db/`` and ``repo/`` (queries);
- ``jobs/``: the scheduler, leader election, advisory locks and the list of background jobs, with
  the jobs that keep the database current (rollups, lifetimes, refits, the weekly report);
- ``judge/``: each process's fleet assessment (rule verdicts, risk), liveness, stragglers;
- ``act/``: the eviction planner and the long-poll that tells schedulers of evictions;
- ``tell/``: alerts and the durable webhook outbox;
- ``metrics/``: ``/metrics``, with every metric family listed in ``metrics/families.py``.

The logic with no web or database in it lives beside the server: ``fleetwatch.rules`` (Xid and
health rules, counter rates), ``fleetwatch.models`` (risk, stragglers, checkpoint advice),
``fleetwatch.notify`` (webhook formats) and ``fleetwatch.reports`` (the weekly report).
"""
