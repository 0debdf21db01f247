"""Client helpers for training jobs: standard library and httpx only, as the agent install."""

from __future__ import annotations

from fleetwatch.client.steps import StepReporter

__all__ = ["StepReporter"]
