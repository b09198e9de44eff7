"""The spot agent's `kubernetes:` and `replacement:` settings: off by default (the agent is
unchanged), and a start refused naming the missing field. In-process, no agent thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from redline.agents.spot import SpotAgent, SpotAgentSettings, build_agent_app
from redline.cli import app as cli_app
from redline.core.settings import SettingsError, load_settings
from redline.platform.spot import SpotAgentError
from redline.slo.load import load_spec

SPOT = load_spec(None).spec.spot
IN_CLUSTER = ("KUBERNETES_SERVICE_HOST", "NODE_NAME", "POD_NAMESPACE")


@pytest.fixture(autouse=True)
def outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in IN_CLUSTER:
        monkeypatch.delenv(name, raising=False)


def settings_of(**values: Any) -> SpotAgentSettings:
    return SpotAgentSettings.model_validate(
        {
            "node": "spot-a",
            "provider": "manual",
            "redis_url": "redis://127.0.0.1:9/0",
            "admin_open": True,
            **values,
        }  # fmt: skip
    )


def test_off_by_default_the_flow_has_no_cluster_hooks() -> None:
    settings = settings_of()
    assert not settings.kubernetes.enabled and settings.replacement.kind == "none"
    agent: SpotAgent = build_agent_app(settings, SPOT).state.agent
    assert not agent.cluster.enabled
    assert agent.flow.on_notice is None and agent.flow.on_recovered is None


def token(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text("t\n")
    return str(path)


def test_enabled_it_hooks_the_flow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "ip-10-0-0-1")
    monkeypatch.setenv("POD_NAMESPACE", "serving")
    settings = settings_of(
        kubernetes={"enabled": True, "api_url": "http://127.0.0.1:9", "token_file": token(tmp_path),
                    "pod_selector": "app=chat"},
        replacement={"kind": "kubernetes", "deployment": "chat"},
    )  # fmt: skip
    agent: SpotAgent = build_agent_app(settings, SPOT).state.agent
    assert agent.cluster.nodes is not None and agent.cluster.nodes.node_name == "ip-10-0-0-1"
    assert agent.cluster.replacement is not None
    assert agent.cluster.replacement.provider.via == "kubernetes"
    assert agent.flow.on_notice == agent.cluster.notice


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kubernetes": {"enabled": True, "api_url": "http://k:1", "pod_selector": "a=b"}},
         "kubernetes.token_file"),
        ({"kubernetes": {"enabled": True, "pod_selector": "a=b", "token_file": "TOKEN"}},
         "kubernetes.api_url: required"),
        ({"kubernetes": {"enabled": True, "api_url": "http://k:1", "token_file": "TOKEN",
                         "pod_selector": "a=b"}}, "kubernetes.node_name: required"),
        ({"kubernetes": {"api_url": "http://k:1", "token_file": "TOKEN"},
          "replacement": {"kind": "kubernetes", "deployment": "chat"}},
         "replacement.namespace: required"),
    ],
)  # fmt: skip
def test_missing_settings_refuse_the_start(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    for block in values.values():
        if block.get("token_file") == "TOKEN":
            block["token_file"] = token(tmp_path)
    with pytest.raises(SpotAgentError, match=message):
        build_agent_app(settings_of(**values), SPOT)


def test_a_config_file_names_the_block_and_field(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    hook = {"kind": "webhook", "url": "https://h"}
    config.write_text(yaml.safe_dump({"node": "a", "replacement": hook}))
    with pytest.raises(SettingsError, match=r"replacement: .*replacement.token_file: required"):
        load_settings(SpotAgentSettings, config)
    config.write_text(yaml.safe_dump({"node": "a", "kubernetes": {"enable": True}}))
    with pytest.raises(SettingsError, match=r"kubernetes.enable: Extra inputs"):
        load_settings(SpotAgentSettings, config)


def test_the_cli_refuses_to_start_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": "spot-a", "provider": "manual", "admin_open": True,
        "kubernetes": {"enabled": True, "api_url": "http://127.0.0.1:9",
                       "token_file": token(tmp_path), "node_name": "n1"},
    }))  # fmt: skip
    result = CliRunner().invoke(cli_app, ["spot-agent", "run", "--config", str(config)])
    assert result.exit_code == 2
    assert "kubernetes.namespace: required" in result.output


@pytest.mark.parametrize("node", ["ip-10-0-1-2.ec2.internal", "gke-pool-1-abcd", "spot-a"])
def test_a_kubernetes_node_name_is_a_node(node: str) -> None:
    assert SpotAgentSettings(node=node).node == node


@pytest.mark.parametrize("node", ["Spot_A", "-spot", "spot.", "a b"])
def test_a_name_kubernetes_would_refuse_is_refused(node: str) -> None:
    with pytest.raises(ValueError, match="pattern"):
        SpotAgentSettings(node=node)
