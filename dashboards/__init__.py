"""Grafana dashboards built from the spec."""
