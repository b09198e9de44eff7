"""Every pod of every region: finding them, the LoRA operations on one pod, the per-pod report.

The operations are idempotent: each first reads the pod's `/v1/models` and does only what is
missing. A pod's refusal (a 4xx) raises `PodError`, naming the pod; a transport failure or a 5xx
raises `TransientError` (the job is retried, and the retry converges).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from redline.platform.endpoints import EndpointsError, Pod, PodSource, discover_pods
from redline.platform.serving import (
    ServingError,
    adapter_roots,
    fetch_models,
    is_already_loaded,
    load_lora_adapter,
    unload_lora_adapter,
)
from redline.remediation.playbook import PlaybookError
from redline.remediation.settings import ServingSettings

INPLACE_NEEDS = "load_inplace needs a vLLM release with PR #31326"


class PodError(Exception):
    """A pod refused an operation (a 4xx, an odd answer); the message names what and why."""


@dataclass(frozen=True)
class Fleet:
    """The pods to act on, region by region, and the ones left alone (not ready, terminating)."""

    pods: tuple[Pod, ...]
    skipped: tuple[Pod, ...] = ()

    def by_region(self) -> dict[str, list[str]]:
        """Region -> pod names, for records."""
        regions: dict[str, list[str]] = {}
        for pod in self.pods:
            regions.setdefault(pod.region, []).append(pod.name)
        return regions


def pod_sources(serving: ServingSettings) -> dict[str, PodSource]:
    """Region -> how to find its pods: `serving.pods`, else its upstream URL as its one pod."""
    sources = {region: PodSource(urls=[url]) for region, url in serving.upstreams.items()}
    sources.update(serving.pods)
    return dict(sorted(sources.items()))


def describe_sources(serving: ServingSettings) -> str:
    """The pod sources in words, for the plan."""
    return "; ".join(
        f"{region}: {source.describe()}" for region, source in pod_sources(serving).items()
    )


def discover_fleet(serving: ServingSettings) -> Fleet:
    """Every region's pods; PlaybookError when a region's pods cannot be found or none is ready
    (TransientError, from discovery, when it is worth a retry)."""
    pods: list[Pod] = []
    skipped: list[Pod] = []
    for region, source in pod_sources(serving).items():
        try:
            found = discover_pods(region, source, serving.timeout_seconds)
        except EndpointsError as exc:
            raise PlaybookError(f"region {region}: cannot find its pods: {exc}") from None
        active = [pod for pod in found if pod.skipped is None]
        if not active:
            raise PlaybookError(
                f"region {region}: no pod to act on ({source.describe()}: "
                + (", ".join(f"{p.name} {p.skipped}" for p in found) or "nothing found")
                + ")"
            )
        pods += active
        skipped += [pod for pod in found if pod.skipped is not None]
    return Fleet(tuple(pods), tuple(skipped))


# ---- the per-pod report -------------------------------------------------------------------------


@dataclass
class PodReport:
    """What happened on one pod, phase by phase (loaded, checked, switched, verified, unloaded),
    and the error that stopped it, if any."""

    pod: Pod
    phases: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        data: dict[str, Any] = {"region": self.pod.region, "url": self.pod.url, **self.phases}
        if self.pod.skipped is not None:
            data["skipped"] = self.pod.skipped
        if self.error is not None:
            data["error"] = self.error
        return data


class FleetReport:
    """The per-pod report of one candidate's switch (or of a check), keyed `<region>/<pod>`."""

    def __init__(self, fleet: Fleet) -> None:
        self.entries = {pod.key: PodReport(pod) for pod in (*fleet.pods, *fleet.skipped)}

    def note(self, pod: Pod, phase: str, text: str) -> None:
        """Record what a phase did on a pod."""
        self.entries[pod.key].phases[phase] = text

    def fail(self, pod: Pod, phase: str, error: str) -> None:
        """Record the error that stopped a phase on a pod."""
        entry = self.entries[pod.key]
        entry.phases[phase] = "failed"
        entry.error = error if entry.error is None else f"{entry.error}; {error}"

    def failures(self) -> dict[str, str]:
        """Pod key -> error, for the pods that failed."""
        return {key: e.error for key, e in self.entries.items() if e.error is not None}

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """Pod key -> its report."""
        return {key: entry.as_dict() for key, entry in sorted(self.entries.items())}

    def summary(self) -> str:
        """One clause per pod: `region/pod: phase=what, ...`, or what stopped it."""
        return summarize_pods(self.as_dict())


def summarize_pods(pods: Mapping[str, Mapping[str, Any]]) -> str:
    """One clause per pod of a report (`FleetReport.as_dict` form), for job errors."""
    clauses = []
    for key, entry in sorted(pods.items()):
        if "skipped" in entry:
            clauses.append(f"{key}: left alone ({entry['skipped']})")
            continue
        done = ", ".join(
            f"{phase} {text}"
            for phase, text in entry.items()
            if phase not in ("region", "url", "error")
        )
        error = entry.get("error")
        clauses.append(f"{key}: " + (f"{done}; ERROR {error}" if error else done or "untouched"))
    return "; ".join(clauses)


# ---- operations on one pod ----------------------------------------------------------------------


def served_adapters(client: httpx.Client, pod: Pod) -> dict[str, str | None]:
    """Adapter name -> the path it is served from, per the pod's `/v1/models`."""
    try:
        return adapter_roots(fetch_models(client, pod.url))
    except ServingError as exc:
        raise PodError(str(exc)) from None


def _refusal(what: str, status: int, message: str) -> PodError:
    return PodError(f"{what}: HTTP {status}: {message}")


def stage(client: httpx.Client, pod: Pod, staged: str, path: str) -> str:
    """Load `path` under the staged name `staged`, beside what the pod serves; what was done."""
    before = served_adapters(client, pod)
    if before.get(staged) == path:
        return "already loaded"
    if staged in before:
        # A staged copy from other files (an earlier, interrupted job): no client asks for a
        # staged name, so it can be replaced the plain way.
        gone = unload_lora_adapter(client, pod.url, staged)
        if gone.status not in (200, 404):
            raise _refusal(f"unload of the stale {staged}", gone.status, gone.error_message())
    answer = load_lora_adapter(client, pod.url, staged, path)
    if answer.status == 200:
        return "loaded"
    if is_already_loaded(answer) and served_adapters(client, pod).get(staged) == path:
        return "loaded by another caller"
    raise _refusal(f"load of {staged} from {path}", answer.status, answer.error_message())


def switch_in_place(client: httpx.Client, pod: Pod, name: str, path: str) -> str:
    """Serve `name` from `path` without a moment where `name` is missing (vLLM's in-place load);
    what was done. PodError when the pod cannot (its `name` is then unchanged)."""
    before = served_adapters(client, pod)
    if before.get(name) == path:
        return "already served"
    answer = load_lora_adapter(client, pod.url, name, path, inplace=True)
    if answer.status != 200:
        if is_already_loaded(answer):
            raise PodError(
                f"cannot reload {name} in place ({INPLACE_NEEDS}); it still serves "
                f"{before.get(name)}"
            )
        raise _refusal(
            f"in-place load of {name} from {path}", answer.status, answer.error_message()
        )
    after = served_adapters(client, pod).get(name)
    if after != path:
        raise PodError(f"after the in-place load, {name} is served from {after}, not {path}")
    return "reloaded in place" if name in before else "loaded (it was not served)"


def unload(client: httpx.Client, pod: Pod, names: Iterable[str]) -> list[str]:
    """Unload each of `names` the pod serves; the names unloaded (404: gone already, fine)."""
    present = served_adapters(client, pod)
    done = []
    for name in names:
        if name not in present:
            continue
        answer = unload_lora_adapter(client, pod.url, name)
        if answer.status not in (200, 404):
            raise _refusal(f"unload of {name}", answer.status, answer.error_message())
        done.append(name)
    return done


def serving_summary(roots: dict[str, str | None], name: str, staged: Sequence[str]) -> str:
    """`<name> from <path>` plus the staged copies a pod holds, for records."""
    text = f"{name} from {roots[name]}" if name in roots else f"{name} NOT LOADED"
    if staged:
        text += "; staged: " + ", ".join(f"{s} from {roots.get(s)}" for s in staged)
    return text


__all__ = [
    "Fleet",
    "FleetReport",
    "PodError",
    "PodReport",
    "describe_sources",
    "discover_fleet",
    "pod_sources",
    "served_adapters",
    "serving_summary",
    "stage",
    "summarize_pods",
    "switch_in_place",
    "unload",
]
