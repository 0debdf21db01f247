"""The central service: FastAPI app, storage, ingest, read API, auth and /metrics."""
