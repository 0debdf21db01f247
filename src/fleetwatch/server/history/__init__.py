"""History imported from elsewhere: a month of dcgm-exporter series read back from Prometheus,
turned into the hourly rollups the risk models read (``fleetwatch import prometheus``)."""
