"""Scheduler adapters: carry out FleetWatch's evictions in Slurm or Kubernetes.

Each adapter polls the server's scheduler API (``fleetwatch.adapters.client``), and one
``SyncEngine`` pass (``fleetwatch.adapters.sync``) drives a ``NodeBackend``:
``fleetwatch.adapters.slurm`` (scontrol) or ``fleetwatch.adapters.kubernetes`` (the official
client, extra ``fleetwatch[k8s]``). Import those modules directly; this package imports nothing.
"""

from __future__ import annotations

__all__: list[str] = []
