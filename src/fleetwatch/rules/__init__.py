"""Health rules: the Xid catalogue (:mod:`.xid_catalog`) and the Xid judge (:mod:`.xid`)."""
