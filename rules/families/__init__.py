"""One module per alert family: its rule groups and the promtool cases proving them."""
