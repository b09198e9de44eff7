"""Adapters shared by exporters and playbooks: index write path, snapshots, session CDC, routing."""
