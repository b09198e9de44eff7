"""Sample series and data for the local stack, the dashboard checks and the report examples."""
