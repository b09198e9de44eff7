"""Exporters for the signals no standard exporter publishes."""
