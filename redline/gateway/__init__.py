"""The optional OpenAI-compatible gateway: reroute, P99 including reroute, spot drain."""

from __future__ import annotations

from redline.gateway.app import build_gateway_app
from redline.gateway.metrics import (
    REQUEST_LABELS,
    REROUTE_REASONS,
    TOKEN_LABELS,
    TTFT_BUCKETS,
    GatewayMetrics,
)
from redline.gateway.proxy import Gateway, StreamCutError
from redline.gateway.settings import DEFAULT_GATEWAY_PORT, GatewayConfigError, GatewaySettings
from redline.gateway.spot import SpotDrainRequest, SpotReleaseRequest

__all__ = [
    "DEFAULT_GATEWAY_PORT",
    "Gateway",
    "GatewayConfigError",
    "GatewayMetrics",
    "GatewaySettings",
    "REQUEST_LABELS",
    "REROUTE_REASONS",
    "SpotDrainRequest",
    "SpotReleaseRequest",
    "StreamCutError",
    "TOKEN_LABELS",
    "TTFT_BUCKETS",
    "build_gateway_app",
]
