"""`redline gameday`: a drill run on the user's own cluster, measured from their Prometheus,
Alertmanager and redline's receiver (see `redline.gameday.run`)."""
