"""The node agent: collectors, parsers of what GPUs and drivers print, spool and pusher."""
