"""The `redline` command line: parses arguments and calls the packages (layer 5, thin)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from redline.cli import sources as sources_cli
from redline.cli.common import ConfigOpt, RegionsOpt, err, fail
from redline.cli.lazy import LazyGroup
from redline.generate.chaos import (
    ChaosBuildError,
    ChaosOptions,
    FisOptions,
    build_chaos_outputs,
    parse_durations,
    parse_labels,
)
from redline.generate.kube_redis import REDIS_SENTINEL_DIR, build_redis_sentinel_outputs
from redline.generate.kubernetes import (
    DEFAULT_IMAGE,
    DEFAULT_NAMESPACE,
    KubernetesBuildError,
    KubernetesOptions,
    build_kubernetes_outputs,
)
from redline.generate.outputs import RULES_DIR, build_outputs, diff_outputs, write_outputs
from redline.generate.toolcheck import ToolMissingError, run_checks
from redline.rules.alertmanager import used_playbooks
from redline.rules.build import build_rule_groups
from redline.slo.load import LoadedSpec, SpecError, apply_profile, load_spec

app = typer.Typer(
    name="redline",
    cls=LazyGroup,
    help="SLA red lines, SLOs and remediation for generative-AI serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True)

SpecArg = Annotated[
    Path | None,
    typer.Argument(help="Spec YAML file; the embedded default when omitted.", show_default=False),
]
SpecOpt = Annotated[
    Path | None,
    typer.Option("--spec", help="Spec YAML file; the embedded default when omitted."),
]


@app.callback()
def root() -> None:
    """redline: generate rules from the spec, run the exporters and the remediation receiver."""


def load_or_exit(path: Path | None, playbooks: tuple[str, ...] | None = None) -> LoadedSpec:
    """Load a spec or print its problems (`file: field: message`) and exit 2; with `playbooks`,
    every playbook the spec names must be one of them."""
    try:
        loaded = load_spec(path, playbooks)
    except SpecError as exc:
        raise fail("\n".join(exc.problems)) from None
    for finding in loaded.warnings:
        err.print(finding.render(loaded.source), markup=False)
    return loaded


def _known_playbooks(config: Path | None) -> tuple[str, ...]:
    """The playbooks a spec may name: the built-in ones and the installed `redline.playbooks`
    entry points; with `config`, the remediation settings' `playbook_classes` and factory too."""
    # Imported here, not at the top: the other commands do not need them. Without `config`
    # no playbook class is imported (the built-in ones pull in pymilvus, and validate is light).
    from redline.remediation.playbook import RegistryError, load_entry_point_names
    from redline.slo.spec import PLAYBOOK_NAMES

    if config is None:
        return tuple(sorted({*PLAYBOOK_NAMES, *load_entry_point_names()}))
    from redline.core.settings import SettingsError, load_settings
    from redline.remediation.catalog import load_known_playbooks, load_registry
    from redline.remediation.settings import DEFAULT_REGISTRY, RemediationSettings

    try:
        settings = load_settings(RemediationSettings, config)
        registry = (
            None
            if settings.playbooks == DEFAULT_REGISTRY
            else load_registry(settings.playbooks, settings)
        )
        return load_known_playbooks(settings, registry)
    except (SettingsError, RegistryError) as exc:
        raise fail(str(exc)) from None


@app.command()
def validate(
    spec: SpecArg = None,
    config: ConfigOpt = None,
    metrics_url: Annotated[
        str | None,
        typer.Option(
            "--metrics-url",
            help="Also check the spec's sources against this live engine's /metrics: its "
            "profile, served buckets, thresholds on them, series present.",
        ),
    ] = None,
) -> None:
    """Validate a spec: exit 0 when usable (warnings printed), 2 with one line per problem.

    Every playbook the spec names must be known: built in, an installed `redline.playbooks`
    entry point or, with `--config` (the remediation settings), one of its `playbook_classes`
    or of its `playbooks` factory's registry. With `--metrics-url`, the engine must be the one
    the spec reads (exit codes 3, 4, 5 as `redline sources detect`).
    """
    loaded = load_or_exit(spec, _known_playbooks(config))
    if metrics_url is not None:
        text = sources_cli.fetch_exposition(metrics_url)
        detection = sources_cli.detect_or_exit(metrics_url, text)
        sources_cli.check_against_engine(loaded.source, loaded.spec, detection)
    s = loaded.spec
    console.print(
        f"{loaded.source}: ok: spec {s.version} for {s.service}, regions {', '.join(s.regions)}, "
        f"{len(s.slos)} SLOs, {len(loaded.warnings)} warning(s)",
        markup=False,
        highlight=False,
    )


ProfileOpt = Annotated[
    str | None, typer.Option("--profile", help="Timing profile of the spec (e.g. local).")
]


def source_name(loaded: LoadedSpec) -> str:
    """How generated files name their spec: a stable path, never an absolute temp path."""
    if loaded.source.startswith("<embedded>/"):
        return "slo/specs/" + loaded.source.removeprefix("<embedded>/")
    return Path(loaded.source).name


def _generated(spec_path: Path | None, profile: str | None) -> tuple[LoadedSpec, dict[Path, str]]:
    loaded = load_or_exit(spec_path)
    try:
        spec = apply_profile(loaded.spec, profile)
    except SpecError as exc:
        raise fail("\n".join(f"{loaded.source}: {line}" for line in exc.problems)) from None
    return loaded, build_outputs(spec, source_name(loaded))


@app.command()
def generate(
    spec: SpecOpt = None,
    out: Annotated[
        Path, typer.Option("--out", help="Root the generated tree is written under.")
    ] = Path("."),
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if the files on disk differ.")
    ] = False,
    profile: ProfileOpt = None,
    kubernetes: Annotated[
        Path | None,
        typer.Option(
            "--kubernetes",
            help="Write (or --check) only the Kubernetes manifests and kustomization.yaml, "
            "into this directory, with the options below.",
            show_default=False,
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option("--image", help=f"Image of the redline pods (default {DEFAULT_IMAGE})."),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", help=f"Namespace (default {DEFAULT_NAMESPACE})."),
    ] = None,
    serving_namespace: Annotated[
        str | None,
        typer.Option(
            "--serving-namespace",
            help="Namespace of the serving Services (llm-<region>) and Milvus "
            "(default: --namespace's).",
        ),
    ] = None,
    spot_provider: Annotated[
        str | None,
        typer.Option("--spot-provider", help="aws or gcp: the spot agent's notices (default aws)."),
    ] = None,
    spot_node_label: Annotated[
        list[str] | None,
        typer.Option(
            "--spot-node-label",
            help="KEY=VALUE marking spot nodes, repeatable (any one matches) "
            "(default: the provider's usual labels).",
        ),
    ] = None,
    chaos: Annotated[
        Path | None,
        typer.Option(
            "--chaos",
            help="Write (or --check) only the game-day experiments into this directory: Chaos "
            "Mesh objects (chaos-mesh/) and, with --fis-role-arn and --fis-az, AWS FIS templates "
            "(aws-fis/). Takes --namespace, --serving-namespace and the options below.",
            show_default=False,
        ),
    ] = None,
    region: Annotated[
        str | None,
        typer.Option("--region", help="--chaos: the region faulted (default: the spec's first)."),
    ] = None,
    serving_selector: Annotated[
        list[str] | None,
        typer.Option(
            "--serving-selector",
            help="--chaos: KEY=VALUE of the serving pods, repeatable; {region} in a value is the "
            "region (default redline.dev/serving=true, redline.dev/region={region}).",
        ),
    ] = None,
    milvus_replica_selector: Annotated[
        list[str] | None,
        typer.Option(
            "--milvus-replica-selector",
            help="--chaos: KEY=VALUE of the Milvus replica's pods, repeatable (default "
            "app.kubernetes.io/name=milvus, app.kubernetes.io/instance=milvus-replica).",
        ),
    ] = None,
    redis_selector: Annotated[
        list[str] | None,
        typer.Option(
            "--redis-selector",
            help="--chaos: KEY=VALUE of the Redis pods, repeatable (default: those of "
            "deploy/kubernetes/redis-sentinel).",
        ),
    ] = None,
    duration: Annotated[
        list[str] | None,
        typer.Option(
            "--duration",
            help="--chaos: EXPERIMENT=DURATION (e.g. latency=10m), repeatable (default: what "
            "its alert needs, from the spec, plus 5m; at most 1h).",
        ),
    ] = None,
    fis_role_arn: Annotated[
        str | None,
        typer.Option("--fis-role-arn", help="--chaos: the IAM role AWS FIS assumes."),
    ] = None,
    fis_az: Annotated[
        str | None,
        typer.Option("--fis-az", help="--chaos: the availability zone of az-power (us-east-1a)."),
    ] = None,
    fis_alarm_arn: Annotated[
        str | None,
        typer.Option(
            "--fis-alarm-arn",
            help="--chaos: the CloudWatch alarm stopping the FIS experiments (default: none).",
        ),
    ] = None,
) -> None:
    """Write rules, promtool tests, alertmanager.yml, the PrometheusRule, dashboards and the
    Kubernetes manifests (deploy/kubernetes) from the spec."""
    chaos_flags = (region, serving_selector, milvus_replica_selector, redis_selector, duration,
                   fis_role_arn, fis_az, fis_alarm_arn)  # fmt: skip
    manifest_flags = (kubernetes, image, spot_provider, spot_node_label)
    if chaos is not None:
        if any(flag is not None for flag in manifest_flags):
            raise fail("--chaos takes no --kubernetes, --image, --spot-provider, --spot-node-label")
        _generate_chaos(
            spec, profile, chaos, check, namespace, serving_namespace, region,
            serving_selector, milvus_replica_selector, redis_selector, duration,
            fis_role_arn, fis_az, fis_alarm_arn,
        )  # fmt: skip
        return
    if any(flag is not None for flag in chaos_flags):
        raise fail(
            "--region, --serving-selector, --milvus-replica-selector, --redis-selector, "
            "--duration and --fis-* need --chaos DIR"
        )
    k8s_flags = (image, namespace, serving_namespace, spot_provider, spot_node_label)
    if kubernetes is None and any(flag is not None for flag in k8s_flags):
        raise fail(
            "--image, --namespace, --serving-namespace, --spot-provider and --spot-node-label "
            "need --kubernetes DIR or --chaos DIR (deploy/kubernetes always has the defaults)"
        )
    if kubernetes is not None:
        _generate_kubernetes(
            spec, profile, kubernetes, check, image, namespace, serving_namespace, spot_provider,
            spot_node_label or [],
        )  # fmt: skip
        return
    _, outputs = _generated(spec, profile)
    _write_or_check(out, outputs, check)


def _kubernetes_options(
    image: str | None,
    namespace: str | None,
    serving_namespace: str | None,
    spot_provider: str | None,
    spot_node_labels: list[str],
) -> KubernetesOptions:
    labels = []
    for item in spot_node_labels:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--spot-node-label {item!r}: expected KEY=VALUE")
        labels.append((key, value))
    if spot_provider not in (None, "aws", "gcp"):
        raise fail(f"--spot-provider {spot_provider!r}: expected aws or gcp")
    return KubernetesOptions(
        namespace=namespace or DEFAULT_NAMESPACE,
        image=image or DEFAULT_IMAGE,
        spot_provider="gcp" if spot_provider == "gcp" else "aws",
        spot_node_labels=tuple(labels),
        serving_namespace=serving_namespace,
    )


def _generate_kubernetes(
    spec_path: Path | None,
    profile: str | None,
    directory: Path,
    check: bool,
    image: str | None,
    namespace: str | None,
    serving_namespace: str | None,
    spot_provider: str | None,
    spot_node_labels: list[str],
) -> None:
    options = _kubernetes_options(
        image, namespace, serving_namespace, spot_provider, spot_node_labels
    )
    loaded = load_or_exit(spec_path)
    try:
        spec = apply_profile(loaded.spec, profile)
        outputs = build_kubernetes_outputs(spec, source_name(loaded), options, Path("."))
        outputs |= build_redis_sentinel_outputs(
            source_name(loaded), options, Path(REDIS_SENTINEL_DIR.name)
        )
    except SpecError as exc:
        raise fail("\n".join(f"{loaded.source}: {line}" for line in exc.problems)) from None
    except KubernetesBuildError as exc:
        raise fail(str(exc)) from None
    _write_or_check(directory, outputs, check)


def _generate_chaos(
    spec_path: Path | None,
    profile: str | None,
    directory: Path,
    check: bool,
    namespace: str | None,
    serving_namespace: str | None,
    region: str | None,
    serving_selector: list[str] | None,
    milvus_replica_selector: list[str] | None,
    redis_selector: list[str] | None,
    durations: list[str] | None,
    fis_role_arn: str | None,
    fis_az: str | None,
    fis_alarm_arn: str | None,
) -> None:
    if (fis_role_arn is None) != (fis_az is None) or (fis_alarm_arn and fis_role_arn is None):
        raise fail("the FIS templates need --fis-role-arn and --fis-az together (and "
                   "--fis-alarm-arn only with them)")  # fmt: skip
    loaded = load_or_exit(spec_path)
    try:
        defaults = ChaosOptions()
        options = ChaosOptions(
            kubernetes=_kubernetes_options(None, namespace, serving_namespace, None, []),
            region=region,
            serving_selector=parse_labels(serving_selector, "--serving-selector")
            if serving_selector
            else defaults.serving_selector,
            milvus_replica_selector=parse_labels(
                milvus_replica_selector, "--milvus-replica-selector"
            )
            if milvus_replica_selector
            else defaults.milvus_replica_selector,
            redis_selector=parse_labels(redis_selector or [], "--redis-selector"),
            durations=parse_durations(durations or []),
            fis=FisOptions(fis_role_arn, fis_az, fis_alarm_arn)
            if fis_role_arn is not None and fis_az is not None
            else None,
        )
        outputs = build_chaos_outputs(
            apply_profile(loaded.spec, profile), source_name(loaded), options
        )
    except SpecError as exc:
        raise fail("\n".join(f"{loaded.source}: {line}" for line in exc.problems)) from None
    except ChaosBuildError as exc:
        raise fail(str(exc)) from None
    _write_or_check(directory, outputs, check)


def _write_or_check(out: Path, outputs: dict[Path, str], check: bool) -> None:
    if check:
        diffs = diff_outputs(out, outputs)
        for path, diff in diffs.items():
            err.print(f"{path}: differs from the spec; run `redline generate`", markup=False)
            err.print(diff, markup=False)
        if diffs:
            raise typer.Exit(1)
        console.print(f"{len(outputs)} generated files are up to date", markup=False)
        return
    changed = write_outputs(out, outputs)
    for path in outputs:
        state = "written" if path in changed else "unchanged"
        console.print(f"{out / path}: {state}", markup=False, highlight=False)


@app.command()
def check(
    directory: Annotated[
        Path, typer.Option("--dir", help="Directory holding the generated files.")
    ] = RULES_DIR,
) -> None:
    """Run promtool check rules, promtool test rules and amtool check-config on the output."""
    try:
        results = run_checks(directory)
    except ToolMissingError as exc:
        raise fail(str(exc), 3) from None
    for result in results:
        mark = "ok" if result.ok else "FAILED"
        console.print(f"{result.name}: {mark}", markup=False)
        if not result.ok:
            console.print(result.output, markup=False, highlight=False)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


def summarize(loaded: LoadedSpec, profile: str | None) -> None:
    """Print what the spec generates: alerts, recording rules, routes."""
    from rich.table import Table

    spec = apply_profile(loaded.spec, profile)
    groups = build_rule_groups(spec)
    table = Table(title=f"redline rules for {spec.service}")
    for column in ("group", "recording rules", "alerts"):
        table.add_column(column)
    for group in groups:
        names = sorted({a.alert for a in group.alerts})
        table.add_row(group.name, str(len(group.recordings)), ", ".join(names) or "-")
    console.print(table)
    playbooks = used_playbooks(groups)
    console.print(
        f"Alertmanager routes to the remediation webhook by playbook: {', '.join(playbooks)}"
    )


@app.command()
def demo(
    spec: SpecOpt = None,
    out: Annotated[
        Path, typer.Option("--out", help="Where the demo writes its generated tree.")
    ] = Path(".redline/demo"),
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="Run directory of the local stack.")
    ] = Path(".redline/run"),
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="Leave the stack running after the drills (`redline down` stops it); by "
            "default the demo stops everything it started when it ends or is interrupted.",
        ),
    ] = False,
    once: Annotated[
        bool,
        typer.Option("--once", hidden=True, help="The default now: stop after the drills."),
    ] = False,
    check_only: Annotated[
        bool, typer.Option("--check-only", help="Only generate and check; start no stack.")
    ] = False,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate",
            min=8.0,
            help="Load generator requests per second (default: 10 per core, at most 50).",
            show_default=False,
        ),
    ] = None,
    regions: RegionsOpt = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--source",
            help="Whose metrics feed the rules in the local stack (redline-gateway, or vllm: "
            "no gateway, the simulators publish vLLM's exposition). Default: the spec's "
            "sources.profile.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Generate and check everything, start the local stack, run every drill, print timings.

    Everything the demo started stops when it ends, fails or is interrupted; `--keep` leaves
    the stack up with its URLs printed.
    """
    loaded, outputs = _generated(spec, None)
    console.print(f"spec {loaded.source}: valid ({len(loaded.warnings)} warning(s))", markup=False)
    write_outputs(out, outputs)
    for path in outputs:
        console.print(f"generated {out / path}", markup=False, highlight=False)
    try:
        results = run_checks(out / RULES_DIR)
    except ToolMissingError as exc:
        raise fail(str(exc), 3) from None
    for result in results:
        console.print(f"{result.name}: {'ok' if result.ok else 'FAILED'}", markup=False)
        if not result.ok:
            console.print(result.output, markup=False, highlight=False)
    summarize(loaded, None)
    if not all(r.ok for r in results):
        raise typer.Exit(1)
    if check_only:
        return
    from redline.cli.stack import run_demo

    run_demo(run_dir, spec, keep and not once, rate, regions, source)


sources_cli.register(app)  # light (the spec model only): registered eagerly, like validate


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
