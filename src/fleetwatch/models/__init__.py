"""Statistical models: survival models of GPU lifetimes, risk, straggler detection
(:mod:`.stragglers`) and checkpoint-interval advice (:mod:`.checkpoint`).

Database tables live in ``fleetwatch.server.db``; "model" here always means a statistical model.
"""
