"""The fake Kubernetes API and cloud hook, for the tests: it lives in the development harness
(`redline/devstack/fakes/kubeapi.py`), where the `gpu-node-failure` drill runs it too."""

from __future__ import annotations

from redline.devstack.fakes.kubeapi import (
    MERGE,
    STRATEGIC,
    AppTransport,
    Call,
    Delivery,
    FakeHook,
    FakeKubernetes,
    app_client,
    build_hook_app,
    build_kubeapi_app,
    match_labels,
    merge_patch,
    serve_kubeapi,
    strategic_merge_patch,
)

__all__ = [
    "AppTransport",
    "Call",
    "Delivery",
    "FakeHook",
    "FakeKubernetes",
    "MERGE",
    "STRATEGIC",
    "app_client",
    "build_hook_app",
    "build_kubeapi_app",
    "match_labels",
    "merge_patch",
    "serve_kubeapi",
    "strategic_merge_patch",
]
