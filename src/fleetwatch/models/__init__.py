"""Statistical models: survival models of GPU lifetimes, straggler detection, risk.

Database tables live in ``fleetwatch.server.db``; "model" here always means a statistical model.
"""
