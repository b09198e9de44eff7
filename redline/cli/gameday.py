"""`redline gameday run NAME`: a drill on your own cluster, measured from your Prometheus,
Alertmanager and redline's receiver (`redline.gameday`).

Thin: parses options into a plan (which refuses to start without --namespace, --max-duration and
an abort condition), builds the clients, runs, writes the table.
Exit codes: 0 within every budget; 1 a budget missed, aborted or an error; 2 bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import yaml

from redline.cli.common import err, fail, out
from redline.gameday.plan import GamedayError, GamedayPlan, Safety, build_gameday_plan, render_plan

if TYPE_CHECKING:
    from redline.gameday.cluster import ChaosMeshApi

gameday_app = typer.Typer(
    help="Game days: the drills on your cluster, measured from your own Prometheus, Alertmanager "
    "and redline's receiver.",
    no_args_is_help=True,
)

DEFAULT_AUDIT_FILE = Path(".redline/gameday/audit.jsonl")


def _plan(
    drill: str,
    spec_path: Path | None,
    profile: str | None,
    namespace: str | None,
    serving_namespace: str | None,
    region: str | None,
    serving_selector: list[str] | None,
    safety: Safety,
) -> GamedayPlan:
    from redline.generate.chaos import ChaosBuildError, ChaosOptions, parse_labels
    from redline.generate.kubernetes import KubernetesOptions
    from redline.slo.load import SpecError, apply_profile, load_spec

    try:
        loaded = load_spec(spec_path)
        spec = apply_profile(loaded.spec, profile)
    except SpecError as exc:
        raise fail("\n".join(f"{loaded_source(spec_path)}: {p}" for p in exc.problems)) from None
    try:
        defaults = ChaosOptions()
        options = ChaosOptions(
            kubernetes=KubernetesOptions(
                namespace=namespace or "redline", serving_namespace=serving_namespace
            ),
            region=region,
            serving_selector=parse_labels(serving_selector, "--serving-selector")
            if serving_selector
            else defaults.serving_selector,
        )
        return build_gameday_plan(spec, drill, options, safety)
    except (GamedayError, ChaosBuildError) as exc:
        raise fail(str(exc)) from None


def loaded_source(path: Path | None) -> str:
    """How a spec's problems name it."""
    return str(path) if path is not None else "the embedded spec"


@gameday_app.command("run")
def run(
    drill: Annotated[str, typer.Argument(help="The drill (latency, staleness, session-rpo, ...).")],
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", help="Namespace of the experiment and of redline (required)."),
    ] = None,
    max_duration: Annotated[
        float | None,
        typer.Option("--max-duration", help="Seconds the game day may run at most (required)."),
    ] = None,
    abort_error_ratio: Annotated[
        float | None,
        typer.Option(
            "--abort-error-ratio",
            help="Abort when the client error ratio over the last minute passes this (0-1).",
        ),
    ] = None,
    abort_red_line_after: Annotated[
        float | None,
        typer.Option(
            "--abort-red-line-after", help="Abort when a red line stays breached this many seconds."
        ),
    ] = None,
    prometheus: Annotated[
        str | None, typer.Option("--prometheus", help="Your Prometheus (http://...).")
    ] = None,
    alertmanager: Annotated[
        str | None, typer.Option("--alertmanager", help="Your Alertmanager (http://...).")
    ] = None,
    receiver: Annotated[
        str | None, typer.Option("--receiver", help="redline's remediation receiver.")
    ] = None,
    receiver_token_file: Annotated[
        Path | None, typer.Option("--receiver-token-file", help="Bearer token of its /jobs.")
    ] = None,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply", help="Create the experiment through the Kubernetes API (else: by hand)."
        ),
    ] = False,
    api_url: Annotated[
        str | None, typer.Option("--api-url", help="--apply: the Kubernetes API server.")
    ] = None,
    token_file: Annotated[
        Path | None, typer.Option("--token-file", help="--apply: a bearer token file.")
    ] = None,
    ca_file: Annotated[
        Path | None, typer.Option("--ca-file", help="--apply: the API server's CA bundle.")
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig", help="--apply: a kubeconfig (instead of --api-url/--token-file)."
        ),
    ] = None,
    context: Annotated[
        str | None, typer.Option("--context", help="--kubeconfig: the context (default: current).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and the experiment; apply nothing.")
    ] = False,
    audit_redis: Annotated[
        str | None,
        typer.Option(
            "--audit-redis", help="Audit into redline's trail in this Redis (the receiver's)."
        ),
    ] = None,
    audit_prefix: Annotated[
        str, typer.Option("--audit-prefix", help="--audit-redis: the receiver's key prefix.")
    ] = "redline:remediation",
    audit_file: Annotated[
        Path, typer.Option("--audit-file", help="Hash-chained JSONL audit (mirror with Redis).")
    ] = DEFAULT_AUDIT_FILE,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Write gameday.md and gameday.json here.")
    ] = None,
    poll_seconds: Annotated[
        float, typer.Option("--poll", min=0.1, help="Seconds between polls.")
    ] = 1.0,
    serving_namespace: Annotated[
        str | None, typer.Option("--serving-namespace", help="Namespace of the serving pods.")
    ] = None,
    region: Annotated[str | None, typer.Option("--region", help="The region faulted.")] = None,
    serving_selector: Annotated[
        list[str] | None,
        typer.Option("--serving-selector", help="KEY=VALUE of the serving pods, repeatable."),
    ] = None,
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Spec YAML (default: embedded).")
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="Timing profile.")] = None,
) -> None:
    """Inject one drill's fault on your cluster, measure detect, notify, playbook, remediate
    and recover, remove the experiment, and print fault | RTO | RPO | failed requests | verdict."""
    safety = Safety(namespace, max_duration, abort_error_ratio, abort_red_line_after)
    plan = _plan(drill, spec, profile, namespace, serving_namespace, region, serving_selector,
                 safety)  # fmt: skip
    out.print(render_plan(plan), markup=False, highlight=False)
    if dry_run:
        out.print(yaml.safe_dump(plan.experiment, sort_keys=False), markup=False, end="")
        out.print("dry run: nothing applied", markup=False)
        return
    if prometheus is None or alertmanager is None:
        raise fail("--prometheus and --alertmanager are required (what the game day measures)")
    kube = None
    if apply:
        if kubeconfig is None and (api_url is None or token_file is None):
            raise fail("--apply needs --kubeconfig, or --api-url and --token-file (or run "
                       "without --apply and inject the experiment by hand)")  # fmt: skip
        kube = KubeAccess(kubeconfig, context, api_url, token_file, ca_file)
    sources = Sources(prometheus, alertmanager, receiver, receiver_token_file)
    audit = AuditTo(audit_redis, audit_prefix, audit_file)
    _execute(plan, sources, kube, audit, out_dir, poll_seconds)


@dataclass(frozen=True)
class KubeAccess:
    """How `--apply` reaches the Kubernetes API: a kubeconfig, or a URL and a token."""

    kubeconfig: Path | None
    context: str | None
    api_url: str | None
    token_file: Path | None
    ca_file: Path | None


@dataclass(frozen=True)
class Sources:
    """What the game day measures from."""

    prometheus: str
    alertmanager: str
    receiver: str | None
    receiver_token_file: Path | None


@dataclass(frozen=True)
class AuditTo:
    """Where the game day's steps are audited."""

    redis_url: str | None
    prefix: str
    file: Path


@contextmanager
def _chaos_api(kube: KubeAccess | None) -> Iterator[ChaosMeshApi | None]:
    from redline.gameday.cluster import ChaosMeshApi
    from redline.platform.spot import KubernetesClient, KubernetesError, KubernetesSettings
    from redline.platform.spot.kubeconfig import open_kubeconfig

    if kube is None:
        yield None
        return
    if kube.kubeconfig is not None:
        try:
            with open_kubeconfig(kube.kubeconfig, kube.context) as client:
                yield ChaosMeshApi(client)
        except KubernetesError as exc:
            raise fail(str(exc)) from None
        return
    assert kube.api_url is not None and kube.token_file is not None
    try:
        settings = KubernetesSettings(
            api_url=kube.api_url, token_file=kube.token_file, ca_file=kube.ca_file
        )
        client = KubernetesClient.from_target(settings.resolve(node_actions=False))
    except (KubernetesError, ValueError) as exc:
        raise fail(str(exc)) from None
    try:
        yield ChaosMeshApi(client)
    finally:
        client.close()


def _execute(
    plan: GamedayPlan,
    sources: Sources,
    kube: KubeAccess | None,
    audit_to: AuditTo,
    out_dir: Path | None,
    poll_seconds: float,
) -> None:
    import redis

    from redline.core.settings import SettingsError, read_secret
    from redline.gameday.audit import Audit, FileAudit
    from redline.gameday.observe import Observer
    from redline.gameday.report import render_json, render_markdown
    from redline.gameday.run import run_gameday
    from redline.platform.prometheus import PrometheusClient
    from redline.remediation.audit import AuditLog

    try:
        audit: Audit = (
            AuditLog(redis.Redis.from_url(audit_to.redis_url), audit_to.prefix, audit_to.file)
            if audit_to.redis_url
            else FileAudit(audit_to.file)
        )
    except GamedayError as exc:
        raise fail(str(exc)) from None
    try:
        secret = read_secret(sources.receiver_token_file, None, "--receiver-token-file")
    except SettingsError as exc:
        raise fail(str(exc)) from None
    token = secret.get_secret_value() if secret is not None else None
    observer = Observer(
        PrometheusClient(sources.prometheus), sources.alertmanager, sources.receiver, token
    )

    def confirm() -> None:
        err.print(yaml.safe_dump(plan.experiment, sort_keys=False), markup=False, end="")
        err.print("inject this experiment now (kubectl apply -f -), then press Enter", markup=False)
        sys.stdin.readline()

    try:
        with _chaos_api(kube) as chaos:
            result = run_gameday(
                plan, observer, audit, chaos, confirm=confirm if chaos is None else None,
                poll_seconds=poll_seconds, say=lambda line: err.print(line, markup=False),
            )  # fmt: skip
    finally:
        observer.close()
    markdown = render_markdown([result])
    out.print(markdown, markup=False, highlight=False, end="")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gameday.md").write_text(markdown)
        (out_dir / "gameday.json").write_text(render_json([result]))
    if not result.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `gameday` to the `redline` app."""
    app.add_typer(gameday_app, name="gameday")
