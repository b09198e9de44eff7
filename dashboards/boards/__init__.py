"""One module per dashboard, each a pure builder from the spec."""
