"""The optional OpenAI-compatible gateway: reroute, P99 including reroute, spot drain."""

from __future__ import annotations

from redline.gateway.app import (
    DEFAULT_GATEWAY_PORT,
    REQUEST_LABELS,
    REROUTE_REASONS,
    TOKEN_LABELS,
    TTFT_BUCKETS,
    Gateway,
    GatewayConfigError,
    GatewayMetrics,
    GatewaySettings,
    SpotDrainRequest,
    SpotReleaseRequest,
    StreamCutError,
    build_gateway_app,
)

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
