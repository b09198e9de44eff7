"""Dashboard checks and previews: every panel query against a live Prometheus."""
