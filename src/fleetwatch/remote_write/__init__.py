"""Prometheus remote write ingestion: series pushed by a Prometheus server, mapped onto
FleetWatch readings (one module per exporter)."""
