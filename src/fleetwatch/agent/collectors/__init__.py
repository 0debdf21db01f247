"""Collectors: one small class per telemetry source, all yielding canonical telemetry."""
