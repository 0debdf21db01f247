"""Telling people: alerts and the durable webhook outbox that delivers them."""
