"""Alertmanager webhook receiver, durable job store and playbooks."""
