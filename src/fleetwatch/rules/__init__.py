"""Health rules: the Xid catalogue (:mod:`.xid_catalog`) and judge (:mod:`.xid`), the telemetry
rules (:mod:`.health`), counter rates (:mod:`.rates`) and a fleet's overrides (:mod:`.overrides`).

Pure: events and samples in, verdicts out; nothing here imports the server.
"""
