"""The central service, in layers; each imports only its own layer and those below it
(``tests/unit/test_layering.py`` holds them to it).

- web, here: the app factory (``app.py``), request dependencies, auth, error handling, the fleet
  page, ``routers/`` (one per resource, mapping the data layer's rows to ``schemas/``);
- ``background.py``: every background job, how often and where it runs; it starts the stages;
- the stages, each above the next: ``metrics/`` (``/metrics``), ``tell/`` (alerts, the durable
  webhook outbox, the weekly report's delivery), ``act/`` (the eviction planner, job notices, the
  evictions long-poll), ``judge/`` (each process's fleet assessment: rule verdicts, risk,
  stragglers), ``upkeep/`` (hourly rollups, retention, GPU lifetimes, refits), ``ingest/`` (a push
  from the wire to the store);
- ``repo/``: the queries;
- ``runtime/``: advisory locks, leader election, precedence, item isolation, the scheduler, what
  leader jobs remember, the urgent lane's queue, and every metric family (``metric_families.py``);
- ``db/``: tables, engine and sessions, migrations, the sample blocks' storage format;
- ``concepts/``: pure definitions shared by the layers above: maintenance windows and selectors,
  node liveness, the fleet's ingest lag, the rule verdict.

The logic with no web or database in it lives beside the server: ``fleetwatch.rules`` (Xid and
health rules, counter rates), ``fleetwatch.models`` (risk, stragglers, checkpoint advice),
``fleetwatch.notify`` (webhook formats) and ``fleetwatch.reports`` (the weekly report).
"""
