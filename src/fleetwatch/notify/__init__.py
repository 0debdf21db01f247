"""Notification formats with no server in them: webhook payloads and their signatures."""
