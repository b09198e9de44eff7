"""Settings and other basics every layer may use."""
