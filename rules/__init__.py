"""Prometheus rules, promtool tests and Alertmanager config built from the spec."""
