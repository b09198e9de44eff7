"""Local fakes of what redline calls on Kubernetes and on a cloud hook (no cluster here): the
spot agent, `gpu_node_failure` (the `gpu-node-failure` drill) and `redline gameday run`.

`FakeKubernetes` holds nodes, pods and Deployment scales and serves exactly the endpoints the
agent uses, with the API server's rules that matter to a client:

- `GET`/`PATCH /api/v1/nodes/{name}`;
- `GET /api/v1/namespaces/{ns}/pods?fieldSelector=spec.nodeName=X&labelSelector=...` (paged by
  `limit`/`continue`; other field selectors are refused, as the API does);
- `PATCH /api/v1/namespaces/{ns}/pods/{name}/status`;
- `GET`/`PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale`;
- `POST /apis/{group}/{version}/namespaces/{ns}/{plural}`, `DELETE .../{name}`: custom objects
  (a game day's Chaos Mesh experiments), with `on_create`/`on_delete` hooks standing in for the
  controller that would act on them.

Bearer tokens: none or unknown -> 401; a token without the verb on the resource -> 403 with the
API server's message. PATCH needs a patch content type (415 otherwise): a JSON merge patch
replaces lists (`status.conditions` included, so a client that sends one there loses the
kubelet's conditions), a strategic merge patch merges `status.conditions` by `type` (nodes'
`spec.taints` has no merge key: replaced, as on a real API server). A patch carrying
`metadata.resourceVersion` is refused with 409 when the object changed since. `interfere`
makes a concurrent writer change an object right after the next read of it. Every call is logged
with its arrival time.

`FakeHook` is a cloud hook: a bearer token, optional failures (503) and a delay, every delivery
recorded.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from redline.core.servers import ServerThread, serve_in_thread

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
EVERYTHING = "*"
SERVICE_ACCOUNT_USER = "system:serviceaccount:redline:spot-agent"
KUBELET_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


@dataclass
class Call:
    """One request the fake answered."""

    at: float
    method: str
    path: str
    verb: str
    resource: str
    name: str
    status: int
    content_type: str | None
    body: Any


def _status(code: int, reason: str, message: str) -> JSONResponse:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip
    return JSONResponse(body, status_code=code)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any, merge_keys: Mapping[str, str]) -> Any:
    """A strategic merge patch for the fields it knows: lists named in `merge_keys` (by path)
    merge by that key; the rest as a JSON merge patch."""

    def walk(current: Any, change: Any, path: str) -> Any:
        if not isinstance(change, dict):
            if isinstance(change, list) and path in merge_keys and isinstance(current, list):
                key = merge_keys[path]
                merged = [copy.deepcopy(item) for item in current]
                for item in change:
                    index = next(
                        (i for i, old in enumerate(merged) if old.get(key) == item.get(key)), None
                    )
                    if index is None:
                        merged.append(copy.deepcopy(item))
                    else:
                        merged[index] = merge_patch(merged[index], item)
                return merged
            return copy.deepcopy(change)
        out = dict(current) if isinstance(current, dict) else {}
        for key, value in change.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = walk(out.get(key), value, f"{path}.{key}" if path else key)
        return out

    return walk(target, patch, "")


_TERM = re.compile(
    r"^\s*(?:(?P<notkey>!)\s*(?P<nk>[\w./-]+)|(?P<key>[\w./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*)|\s+(?P<setop>in|notin)\s*\((?P<set>[^)]*)\))?)\s*$"
)


def match_labels(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether `labels` match a label selector (equality, inequality, existence, in/notin);
    ValueError on a malformed one."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(selector):
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    for term in terms:
        if not term.strip():
            continue
        found = _TERM.match(term)
        if found is None:
            raise ValueError(f"unable to parse requirement: {term!r}")
        if found["notkey"]:
            if found["nk"] in labels:
                return False
            continue
        key, have = found["key"], labels.get(found["key"])
        if found["op"] in ("=", "=="):
            ok = have == found["value"]
        elif found["op"] == "!=":
            ok = have != found["value"]
        elif found["setop"]:
            values = {v.strip() for v in found["set"].split(",")}
            ok = have in values if found["setop"] == "in" else have not in values
        else:
            ok = key in labels
        if not ok:
            return False
    return True


@dataclass
class FakeKubernetes:
    """The objects the agent touches, its tokens and its call log."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    scales: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    tokens: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    interfere: dict[str, Callable[[dict[str, Any]], None]] = field(default_factory=dict)
    fail_next: dict[str, list[int]] = field(default_factory=dict)
    """Per `verb resource`, statuses to answer first (e.g. [503, 503]) before serving it."""
    custom: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    """Custom objects (Chaos Mesh experiments) by (group, plural, namespace, name)."""
    on_create: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    on_delete: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    """What a controller does when a custom object appears or goes (a test's fault hook)."""
    version: int = 1000
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- set-up

    def _bump(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)

    def grant(self, token: str, *rules: tuple[str, str]) -> None:
        """Let `token` do (verb, resource) pairs; ("*", "*") for everything."""
        self.tokens.setdefault(token, set()).update(rules)

    def add_node(self, name: str, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """A Node (with `taints`)."""
        node: dict[str, Any] = {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "uid": f"uid-{name}",
                         "labels": {"kubernetes.io/hostname": name}},
            "spec": {"taints": list(taints)} if taints else {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }  # fmt: skip
        self._bump(node)
        self.nodes[name] = node
        return node

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        labels: Mapping[str, str],
        gate: str | None = "redline.dev/spot-safe",
    ) -> dict[str, Any]:
        """A running pod on `node` with the kubelet's conditions (and the readiness gate)."""
        spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "serve", "image": "x"}]}
        if gate is not None:
            spec["readinessGates"] = [{"conditionType": gate}]
        pod: dict[str, Any] = {
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                         "uid": f"uid-{name}"},
            "spec": spec,
            "status": {"phase": "Running", "conditions": [
                {"type": kind, "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"}
                for kind in KUBELET_CONDITIONS
            ]},
        }  # fmt: skip
        self._bump(pod)
        self.pods[(namespace, name)] = pod
        return pod

    def add_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """A Deployment's Scale."""
        scale: dict[str, Any] = {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "selector": f"app={name}"},
        }  # fmt: skip
        self._bump(scale)
        self.scales[(namespace, name)] = scale

    # -- reading back

    def condition(self, namespace: str, name: str, kind: str) -> str | None:
        """A pod condition's status."""
        for condition in self.pods[(namespace, name)]["status"].get("conditions", []):
            if condition["type"] == kind:
                return str(condition["status"])
        return None

    def taints(self, node: str) -> list[dict[str, Any]]:
        """A node's taints."""
        return list(self.nodes[node].get("spec", {}).get("taints") or [])

    def replicas(self, namespace: str, name: str) -> int:
        """A Deployment's replica count."""
        return int(self.scales[(namespace, name)]["spec"]["replicas"])

    def calls_of(self, verb: str, resource: str, status: int | None = None) -> list[Call]:
        """Logged calls of one verb on one resource (with one status)."""
        return [
            c
            for c in self.calls
            if c.verb == verb and c.resource == resource and (status is None or c.status == status)
        ]


def build_kubeapi_app(fake: FakeKubernetes) -> FastAPI:
    """The fake API server over `fake`."""
    app = FastAPI(title="fake kubernetes API", docs_url=None, openapi_url=None)

    def refused(
        request: Request, verb: str, resource: str, name: str, namespace: str | None
    ) -> JSONResponse | None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or token not in fake.tokens:
            return _status(401, "Unauthorized", "Unauthorized")
        rights = fake.tokens[token]
        if (EVERYTHING, EVERYTHING) in rights or (verb, resource) in rights:
            return None
        group = "apps" if resource.startswith("deployments") else ""
        kind = resource.split("/")[0]
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        what = f'{kind} "{name}"' if name else kind
        return _status(
            403,
            "Forbidden",
            f'{what} is forbidden: User "{SERVICE_ACCOUNT_USER}" cannot {verb} resource '
            f'"{resource}" in API group "{group}" {scope}',
        )

    async def handle(
        request: Request,
        verb: str,
        resource: str,
        name: str,
        namespace: str | None,
        serve: Callable[[Any], JSONResponse],
    ) -> JSONResponse:
        at = time.time()
        raw = await request.body()
        content_type = request.headers.get("content-type")
        body: Any = None
        with fake.lock:
            answer = refused(request, verb, resource, name, namespace)
            queued = fake.fail_next.get(f"{verb} {resource}")
            if answer is None and queued:
                code = queued.pop(0)
                answer = _status(code, "InternalError", f"injected HTTP {code}")
            if answer is None and verb == "create":
                try:
                    body = json.loads(raw)
                except ValueError:
                    answer = _status(400, "BadRequest", "the object is not JSON")
                if answer is None and not isinstance(body, dict):
                    answer = _status(400, "BadRequest", "the object is not a JSON object")
            if answer is None and verb == "patch":
                media = (content_type or "").split(";")[0].strip()
                if media not in (MERGE, STRATEGIC):
                    answer = _status(
                        415,
                        "UnsupportedMediaType",
                        f"the body of the request was in an unknown format - accepted media "
                        f"types include: {JSON_PATCH}, {MERGE}, {STRATEGIC} (this fake: merge "
                        f"and strategic merge only); got {content_type!r}",
                    )
                else:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        answer = _status(400, "BadRequest", "the patch is not JSON")
                    if answer is None and not isinstance(body, dict):
                        answer = _status(400, "BadRequest", "the patch is not a JSON object")
            if answer is None:
                answer = serve(body)
            fake.calls.append(
                Call(at, request.method, request.url.path, verb, resource, name,
                     answer.status_code, content_type, body)
            )  # fmt: skip
        return answer

    def not_found(resource: str, name: str) -> JSONResponse:
        return _status(404, "NotFound", f'{resource} "{name}" not found')

    def apply(
        obj: dict[str, Any], patch: dict[str, Any], strategic: bool, merge_keys: Mapping[str, str]
    ) -> dict[str, Any] | JSONResponse:
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and str(wanted) != obj["metadata"]["resourceVersion"]:
            kind = obj["kind"].lower() + "s"
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind} "{obj["metadata"]["name"]}": the object '
                "has been modified; please apply your changes to the latest version and try again",
            )
        patch = copy.deepcopy(patch)
        (patch.get("metadata") or {}).pop("resourceVersion", None)
        if strategic:
            return dict(strategic_merge_patch(obj, patch, merge_keys))
        return dict(merge_patch(obj, patch))

    def after_read(key: str, obj: dict[str, Any]) -> None:
        change = fake.interfere.pop(key, None)
        if change is not None:
            change(obj)  # another writer, between the client's read and its write
            fake._bump(obj)

    @app.get("/api/v1/nodes/{name}")
    async def get_node(name: str, request: Request) -> JSONResponse:
        def serve(_: Any) -> JSONResponse:
            node = fake.nodes.get(name)
            if node is None:
                return not_found("nodes", name)
            answer = JSONResponse(copy.deepcopy(node))
            after_read(f"nodes/{name}", node)
            return answer

        return await handle(request, "get", "nodes", name, None, serve)

    @app.patch("/api/v1/nodes/{name}")
    async def patch_node(name: str, request: Request) -> JSONResponse:
        strategic = request.headers.get("content-type", "").startswith(STRATEGIC)

        def serve(patch: dict[str, Any]) -> JSONResponse:
            node = fake.nodes.get(name)
            if node is None:
                return not_found("nodes", name)
            updated = apply(node, patch, strategic, {})
            if isinstance(updated, JSONResponse):
                return updated
            for taint in updated.get("spec", {}).get("taints") or []:
                effect = taint.get("effect")
                if not taint.get("key") or effect not in ("NoSchedule", "PreferNoSchedule",
                                                          "NoExecute"):  # fmt: skip
                    return _status(422, "Invalid", f"Node {name!r} is invalid: taint {taint}")
            fake._bump(updated)
            fake.nodes[name] = updated
            return JSONResponse(copy.deepcopy(updated))

        return await handle(request, "patch", "nodes", name, None, serve)

    @app.get("/api/v1/namespaces/{namespace}/pods")
    async def list_pods(namespace: str, request: Request) -> JSONResponse:
        params = request.query_params

        def serve(_: Any) -> JSONResponse:
            node = None
            for term in filter(None, (params.get("fieldSelector") or "").split(",")):
                field_name, _, value = term.replace("==", "=").partition("=")
                if field_name != "spec.nodeName":
                    return _status(
                        400, "BadRequest", f'field label not supported: "{field_name}" (fake)'
                    )
                node = value
            selector = params.get("labelSelector") or ""
            try:
                items = [
                    copy.deepcopy(pod)
                    for (ns, _), pod in sorted(fake.pods.items())
                    if ns == namespace
                    and (node is None or pod["spec"].get("nodeName") == node)
                    and match_labels(selector, pod["metadata"].get("labels") or {})
                ]
            except ValueError as exc:
                return _status(400, "BadRequest", str(exc))
            start = int(params.get("continue") or 0)
            limit = int(params.get("limit") or 0) or len(items) or 1
            page = items[start : start + limit]
            follow = str(start + limit) if start + limit < len(items) else None
            metadata: dict[str, Any] = {"resourceVersion": str(fake.version)}
            if follow:
                metadata["continue"] = follow
            return JSONResponse(
                {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": page}
            )

        return await handle(request, "list", "pods", "", namespace, serve)

    @app.patch("/api/v1/namespaces/{namespace}/pods/{name}/status")
    async def patch_pod_status(namespace: str, name: str, request: Request) -> JSONResponse:
        strategic = request.headers.get("content-type", "").startswith(STRATEGIC)

        def serve(patch: dict[str, Any]) -> JSONResponse:
            pod = fake.pods.get((namespace, name))
            if pod is None:
                return not_found("pods", name)
            # The status subresource writes status only; the rest of the patch is ignored.
            only = {"status": patch.get("status") or {}, "metadata": patch.get("metadata") or {}}
            updated = apply(pod, only, strategic, {"status.conditions": "type"})
            if isinstance(updated, JSONResponse):
                return updated
            for condition in updated["status"].get("conditions") or []:
                if condition.get("status") not in ("True", "False", "Unknown"):
                    return _status(422, "Invalid", f"Pod {name!r} is invalid: {condition}")
            updated["metadata"] = {**pod["metadata"]}
            fake._bump(updated)
            fake.pods[(namespace, name)] = updated
            return JSONResponse(copy.deepcopy(updated))

        return await handle(request, "patch", "pods/status", name, namespace, serve)

    scale_path = "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"

    @app.get(scale_path)
    async def get_scale(namespace: str, name: str, request: Request) -> JSONResponse:
        def serve(_: Any) -> JSONResponse:
            scale = fake.scales.get((namespace, name))
            if scale is None:
                return not_found("deployments.apps", name)
            answer = JSONResponse(copy.deepcopy(scale))
            after_read(f"deployments/{namespace}/{name}", scale)
            return answer

        return await handle(request, "get", "deployments/scale", name, namespace, serve)

    @app.patch(scale_path)
    async def patch_scale(namespace: str, name: str, request: Request) -> JSONResponse:
        strategic = request.headers.get("content-type", "").startswith(STRATEGIC)

        def serve(patch: dict[str, Any]) -> JSONResponse:
            scale = fake.scales.get((namespace, name))
            if scale is None:
                return not_found("deployments.apps", name)
            only = {"spec": patch.get("spec") or {}, "metadata": patch.get("metadata") or {}}
            updated = apply(scale, only, strategic, {})
            if isinstance(updated, JSONResponse):
                return updated
            replicas = updated["spec"].get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                return _status(422, "Invalid", f"Scale {name!r} is invalid: replicas {replicas!r}")
            updated["status"] = {**scale["status"], "replicas": replicas}
            fake._bump(updated)
            fake.scales[(namespace, name)] = updated
            return JSONResponse(copy.deepcopy(updated))

        return await handle(request, "patch", "deployments/scale", name, namespace, serve)

    custom_path = "/apis/{group}/{version}/namespaces/{namespace}/{plural}"

    @app.post(custom_path)
    async def create_custom(
        group: str, version: str, namespace: str, plural: str, request: Request
    ) -> JSONResponse:
        def serve(obj: dict[str, Any]) -> JSONResponse:
            metadata = obj.get("metadata") or {}
            name = metadata.get("name")
            if obj.get("apiVersion") != f"{group}/{version}" or not name:
                return _status(400, "BadRequest", "apiVersion or metadata.name does not match")
            if metadata.get("namespace", namespace) != namespace:
                return _status(400, "BadRequest", "the namespace of the object does not match")
            key = (group, plural, namespace, name)
            if key in fake.custom:
                return _status(409, "AlreadyExists", f'{plural}.{group} "{name}" already exists')
            created = copy.deepcopy(obj)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            created["metadata"] = {
                **metadata,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "creationTimestamp": stamp,
            }
            fake._bump(created)
            fake.custom[key] = created
            for hook in fake.on_create:
                hook(copy.deepcopy(created))
            return JSONResponse(copy.deepcopy(created), status_code=201)

        return await handle(request, "create", plural, "", namespace, serve)

    @app.delete(custom_path + "/{name}")
    async def delete_custom(
        group: str, version: str, namespace: str, plural: str, name: str, request: Request
    ) -> JSONResponse:
        def serve(_: Any) -> JSONResponse:
            gone = fake.custom.pop((group, plural, namespace, name), None)
            if gone is None:
                return not_found(f"{plural}.{group}", name)
            for hook in fake.on_delete:
                hook(copy.deepcopy(gone))
            return JSONResponse(gone)

        return await handle(request, "delete", plural, name, namespace, serve)

    return app


@contextmanager
def serve_kubeapi(fake: FakeKubernetes) -> Iterator[ServerThread]:
    """The fake API server on a free loopback port."""
    server = serve_in_thread(build_kubeapi_app(fake))
    try:
        yield server
    finally:
        server.stop()


class AppTransport(httpx.BaseTransport):
    """A sync httpx transport into an ASGI app, in-process (unit tests: no socket, no thread)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Run the request through the app on a fresh event loop."""
        body = request.read()

        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport) as client:
                answer = await client.request(
                    request.method, request.url, headers=request.headers, content=body
                )
                await answer.aread()
                return answer

        answer = asyncio.run(send())
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def app_client(app: Any, base_url: str) -> httpx.Client:
    """A sync httpx client whose requests go to `app` in-process."""
    return httpx.Client(transport=AppTransport(app), base_url=base_url)


# ---- a cloud hook ---------------------------------------------------------------------------


@dataclass
class Delivery:
    """One POST the hook received."""

    at: float
    status: int
    headers: dict[str, str]
    body: Any


@dataclass
class FakeHook:
    """A cloud hook: bearer `token`, the first `fail_first` deliveries answered 503, each answer
    after `delay_seconds`; every delivery recorded."""

    token: str
    fail_first: int = 0
    delay_seconds: float = 0.0
    deliveries: list[Delivery] = field(default_factory=list)

    def accepted(self) -> list[Delivery]:
        """Deliveries answered 2xx."""
        return [d for d in self.deliveries if d.status < 300]


def build_hook_app(hook: FakeHook, path: str = "/replace") -> FastAPI:
    """The hook's app: POST `path`."""
    app = FastAPI(title="fake replacement hook", docs_url=None, openapi_url=None)

    @app.post(path)
    async def replace(request: Request) -> JSONResponse:
        at = time.time()
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        answer: dict[str, Any]
        if headers.get("authorization") != f"Bearer {hook.token}":
            status, answer = 401, {"error": "bad token"}
        elif headers.get("content-type", "").split(";")[0] != "application/json":
            status, answer = 415, {"error": "JSON only"}
        elif len(hook.deliveries) < hook.fail_first:
            status, answer = 503, {"error": "busy"}
        else:
            key = headers.get("idempotency-key")
            seen = any(d.headers.get("idempotency-key") == key for d in hook.accepted())
            status, answer = 202, {"accepted": True, "duplicate": seen}
        if hook.delay_seconds:
            await asyncio.sleep(hook.delay_seconds)
        hook.deliveries.append(Delivery(at, status, headers, body))
        return JSONResponse(answer, status_code=status)

    return app


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
