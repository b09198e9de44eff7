"""A fake NVIDIA dcgm-exporter: the exposition of N GPUs on named nodes, healthy by default, with
a fault API to make one GPU report an XID (or run hot, lose ECC, fail a row remap, see NVLink
errors), for a real Prometheus to scrape with the generated GPU rules.

It serves every dcgm-exporter series the catalog names (`catalog.EXTERNAL_METRICS` of
`catalog.DCGM_EXPORTER`: the exporter's own names, help texts and types) with its label set
(`catalog.DCGM_LABELS`): `gpu`, `UUID`, `device`, `modelName`, the node in `Hostname` (the
label the spec's `gpu.dcgm_node_label` names), and `pod`, `namespace`, `container` of the pod
holding the GPU when one does (dcgm-exporter adds them in Kubernetes). The series its default
counters CSV leaves commented out are served too: the local stack runs it as a cluster that
enabled them.

- `GET /metrics`: the exposition (format 0.0.4).
- `GET /admin/gpus`: every GPU's state as JSON.
- `POST /admin/xid` `{"node": ..., "gpu": 3, "xid": 79}`: that GPU's last XID
  (`DCGM_FI_DEV_XID_ERRORS` holds the last one's number, as the real gauge does); 0 clears it.
- `POST /admin/gpu` `{"node": ..., "gpu": 3, <GpuFault fields>}`: set any of its health values.
- `POST /admin/reset`: every GPU healthy again.

In-process, `FakeDcgm.set_xid` and `FakeDcgm.set_fault` do the same. Run it alone with
`python -m redline.devstack.fakes.dcgm --node gpu-node-1 --node gpu-node-2 --gpus 8`.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from redline.slo import catalog

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
HEALTHY_TEMPERATURE = 45.0


class DcgmFakeError(Exception):
    """A fault the fake cannot apply, or a fleet it cannot build."""


class UnknownGpuError(DcgmFakeError):
    """A fault names a GPU the fake does not have."""


@dataclass(frozen=True)
class Gpu:
    """One GPU's identity and its health values (healthy: every error 0)."""

    node: str
    index: int
    model: str = DEFAULT_MODEL
    pod: str = ""
    namespace: str = ""
    container: str = ""
    xid: int = 0
    temperature: float = HEALTHY_TEMPERATURE
    row_remap_failure: int = 0
    row_remap_pending: int = 0
    uncorrectable_remapped_rows: int = 0
    ecc_dbe: int = 0
    nvlink_crc_flit: int = 0
    nvlink_crc_data: int = 0
    nvlink_replay: int = 0
    nvlink_recovery: int = 0

    @property
    def uuid(self) -> str:
        """A stable UUID-shaped id, per node and index."""
        return f"GPU-{self.node}-{self.index:04d}"


VALUES: Mapping[str, str] = {
    catalog.DCGM_FI_DEV_XID_ERRORS.name: "xid",
    catalog.DCGM_FI_DEV_GPU_TEMP.name: "temperature",
    catalog.DCGM_FI_DEV_ROW_REMAP_FAILURE.name: "row_remap_failure",
    catalog.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS.name: "uncorrectable_remapped_rows",
    catalog.DCGM_FI_DEV_ROW_REMAP_PENDING.name: "row_remap_pending",
    catalog.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL.name: "ecc_dbe",
    catalog.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL.name: "nvlink_crc_flit",
    catalog.DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL.name: "nvlink_crc_data",
    catalog.DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL.name: "nvlink_replay",
    catalog.DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL.name: "nvlink_recovery",
}
"""Each dcgm-exporter series of the catalog -> the `Gpu` field it shows."""


class GpuFault(BaseModel):
    """Health values to set on one GPU (unset: unchanged)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    xid: int | None = Field(None, ge=0, le=1023, description="The last XID (0: none).")
    temperature: float | None = Field(None, ge=0, le=150, description="GPU temperature (C).")
    row_remap_failure: int | None = Field(None, ge=0, le=1)
    row_remap_pending: int | None = Field(None, ge=0, le=1)
    uncorrectable_remapped_rows: int | None = Field(None, ge=0)
    ecc_dbe: int | None = Field(None, ge=0)
    nvlink_crc_flit: int | None = Field(None, ge=0)
    nvlink_crc_data: int | None = Field(None, ge=0)
    nvlink_replay: int | None = Field(None, ge=0)
    nvlink_recovery: int | None = Field(None, ge=0)


class GpuTarget(GpuFault):
    """A fault and the GPU it is for (the body of `POST /admin/xid` and `/admin/gpu`)."""

    node: str = Field(min_length=1)
    gpu: int = Field(ge=0)


def build_fleet(
    nodes: Iterable[str], gpus_per_node: int, model: str = DEFAULT_MODEL
) -> dict[tuple[str, int], Gpu]:
    """Healthy GPUs `0..gpus_per_node-1` on each node."""
    if gpus_per_node < 1:
        raise DcgmFakeError(f"gpus_per_node must be at least 1, not {gpus_per_node}")
    return {
        (node, index): Gpu(node, index, model) for node in nodes for index in range(gpus_per_node)
    }


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def build_labels(gpu: Gpu, node_label: str = catalog.DCGM_LABEL_HOSTNAME) -> dict[str, str]:
    """dcgm-exporter's labels of `gpu`; the pod's only when a pod holds it (as in Kubernetes)."""
    labels = {
        catalog.DCGM_LABEL_GPU: str(gpu.index),
        catalog.DCGM_LABEL_UUID: gpu.uuid,
        catalog.DCGM_LABEL_DEVICE: f"nvidia{gpu.index}",
        catalog.DCGM_LABEL_MODEL: gpu.model,
        node_label: gpu.node,
    }
    if gpu.pod:
        labels.update({"pod": gpu.pod, "namespace": gpu.namespace, "container": gpu.container})
    return labels


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render_exposition(gpus: Iterable[Gpu], node_label: str = catalog.DCGM_LABEL_HOSTNAME) -> str:
    """The text exposition of every catalog dcgm-exporter series for `gpus` (pure)."""
    ordered = sorted(gpus, key=lambda g: (g.node, g.index))
    lines: list[str] = []
    for metric in catalog.EXTERNAL_METRICS:
        if metric.exporter != catalog.DCGM_EXPORTER:
            continue
        attribute = VALUES[metric.name]
        lines += [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.kind}"]
        for gpu in ordered:
            labels = ",".join(
                f'{key}="{_escape(value)}"' for key, value in build_labels(gpu, node_label).items()
            )
            lines.append(f"{metric.name}{{{labels}}} {_number(getattr(gpu, attribute))}")
    return "\n".join(lines) + "\n"


@dataclass
class FakeDcgm:
    """The GPUs' state (thread-safe) and its exposition: an `Exposition` for a metrics server."""

    gpus: dict[tuple[str, int], Gpu]
    node_label: str = catalog.DCGM_LABEL_HOSTNAME
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def healthy(
        cls,
        nodes: Sequence[str],
        gpus_per_node: int = 8,
        model: str = DEFAULT_MODEL,
        node_label: str = catalog.DCGM_LABEL_HOSTNAME,
    ) -> FakeDcgm:
        """Every GPU of `nodes` healthy."""
        return cls(build_fleet(nodes, gpus_per_node, model), node_label)

    def _key(self, node: str, gpu: int) -> tuple[str, int]:
        if (node, gpu) not in self.gpus:
            nodes = sorted({n for n, _ in self.gpus})
            raise UnknownGpuError(f"no GPU {gpu} on node {node!r} (nodes: {', '.join(nodes)})")
        return node, gpu

    def set_fault(self, node: str, gpu: int, fault: GpuFault) -> Gpu:
        """Set the health values `fault` gives on one GPU; its new state."""
        changes = fault.model_dump(exclude_none=True)
        with self._lock:
            key = self._key(node, gpu)
            self.gpus[key] = replace(self.gpus[key], **changes)
            return self.gpus[key]

    def set_xid(self, node: str, gpu: int, xid: int) -> Gpu:
        """The GPU's last XID (0: none)."""
        return self.set_fault(node, gpu, GpuFault(xid=xid))

    def assign(self, node: str, gpu: int, pod: str, namespace: str, container: str) -> Gpu:
        """The pod holding the GPU (empty strings: none)."""
        with self._lock:
            key = self._key(node, gpu)
            held = replace(self.gpus[key], pod=pod, namespace=namespace, container=container)
            self.gpus[key] = held
            return held

    def reset(self) -> None:
        """Every GPU healthy again (identities and pods kept)."""
        with self._lock:
            for key, gpu in self.gpus.items():
                self.gpus[key] = Gpu(gpu.node, gpu.index, gpu.model, gpu.pod, gpu.namespace,
                                     gpu.container)  # fmt: skip

    def snapshot(self) -> list[Gpu]:
        """Every GPU's current state."""
        with self._lock:
            return list(self.gpus.values())

    def render(self) -> bytes:
        """The exposition now."""
        return render_exposition(self.snapshot(), self.node_label).encode()


class _Handler(BaseHTTPRequestHandler):
    server: _DcgmHTTPServer

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.server.fake.render(), CONTENT_TYPE_PLAIN_0_0_4)
        elif path == "/admin/gpus":
            self._json(200, [asdict(gpu) for gpu in self.server.fake.snapshot()])
        else:
            self._json(404, {"error": f"no route {path}"})

    def do_POST(self) -> None:  # noqa: N802 -- http.server's naming
        path = self.path.split("?", 1)[0]
        fake = self.server.fake
        if path == "/admin/reset":
            fake.reset()
            self._json(200, {"reset": True})
            return
        if path not in ("/admin/xid", "/admin/gpu"):
            self._json(404, {"error": f"no route {path}"})
            return
        length = int(self.headers.get("Content-Length", "0"))
        try:
            target = GpuTarget.model_validate_json(self.rfile.read(length) or b"{}")
            if path == "/admin/xid" and target.xid is None:
                raise DcgmFakeError("xid is required")
            fault = GpuFault.model_validate(target.model_dump(exclude={"node", "gpu"}))
            gpu = fake.set_fault(target.node, target.gpu, fault)
        except ValidationError as exc:
            self._json(422, {"error": exc.errors(include_url=False, include_context=False)})
            return
        except DcgmFakeError as exc:
            self._json(404 if isinstance(exc, UnknownGpuError) else 422, {"error": str(exc)})
            return
        self._json(200, asdict(gpu))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Quiet: scrapes every second would flood the output."""


class _DcgmHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], fake: FakeDcgm) -> None:
        super().__init__(address, _Handler)
        self.fake = fake


class DcgmServer:
    """Serves a `FakeDcgm` (exposition and fault API) from a daemon thread."""

    def __init__(self, fake: FakeDcgm, host: str = "127.0.0.1", port: int = 0) -> None:
        self.fake = fake
        self.host = host
        self._server = _DcgmHTTPServer((host, port), fake)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()

    @property
    def target(self) -> str:
        """`host:port`, as a Prometheus static target."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """Base URL (the admin API's)."""
        return f"http://{self.target}"

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> DcgmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a fake dcgm-exporter until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m redline.devstack.fakes.dcgm")
    parser.add_argument("--node", action="append", required=True, help="a GPU node (repeat)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9400, help="dcgm-exporter's own port")
    parser.add_argument("--node-label", default=catalog.DCGM_LABEL_HOSTNAME)
    args = parser.parse_args(argv)
    try:
        fake = FakeDcgm.healthy(args.node, args.gpus, node_label=args.node_label)
    except DcgmFakeError as exc:
        print(f"dcgm fake: {exc}", file=sys.stderr)
        return 2
    server = DcgmServer(fake, args.host, args.port)
    print(f"fake dcgm-exporter on {server.url}/metrics", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


__all__ = [
    "DcgmFakeError",
    "DcgmServer",
    "FakeDcgm",
    "Gpu",
    "GpuFault",
    "GpuTarget",
    "UnknownGpuError",
    "build_fleet",
    "build_labels",
    "render_exposition",
]


if __name__ == "__main__":
    raise SystemExit(main())
