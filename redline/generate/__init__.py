"""Everything `redline generate` writes from the spec: rules, tests, routes, dashboards, compose."""
