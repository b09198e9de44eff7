"""The `redline` command line: one module per command group, loaded lazily."""

from redline.cli.main import app, main

__all__ = ["app", "main"]
