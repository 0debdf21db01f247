"""Prometheus remote write in: the wire format (:mod:`.wire`), and what a request's series say
as FleetWatch readings (:mod:`.readings`), stored by the server's ingest stage."""
