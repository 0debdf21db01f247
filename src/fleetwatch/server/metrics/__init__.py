"""The server's /metrics: the fleet, risk and evictions rendered for Prometheus."""
