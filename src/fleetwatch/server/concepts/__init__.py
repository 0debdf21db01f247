"""Pure definitions the server's layers share: maintenance selectors and windows, node liveness, the
fleet's ingest lag. They read nothing and import nothing else of the server."""
