"""redline: SLA red lines, SLOs and remediation for generative-AI serving."""

__version__ = "0.1.0"
