"""Errors that more than one layer raises or handles."""

from __future__ import annotations


class TransientError(Exception):
    """A failure worth retrying (timeout, dependency busy): the job is retried with backoff."""
