"""Figures and formats the docs state, checked against what the product does.

- The resource requests and limits docs/deploy.md states are the chart's (values.yaml), and every place
  that names "the DaemonSet's memory limit" (deploy.md, plugins/README.md, docs/checks-exec.md) names
  the chart's agent limit.
- docs/rule-packs.md's kmsg-format example (the file ``--kmsg-path`` reads) parses with the agent's
  own parser into the records the text describes, and ``simulate`` finds what it says.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from agent.app.cli import simulate_lines
from agent.app.config import load_rule_set
from agent.core.paths import builtin_plugins_dir
from agent.sources.kmsg.decoder import Mode, decode

from helpers.k8srender import CHART, REPO

DEPLOY = REPO / "docs" / "deploy.md"
RULE_PACKS = REPO / "docs" / "rule-packs.md"
LIMIT_DOCS = (DEPLOY, REPO / "plugins" / "README.md", REPO / "docs" / "checks-exec.md")


def _chart_resources() -> dict[str, tuple[str, str, str]]:
    """container -> (cpu request, memory request, memory limit) from values.yaml."""
    resources = yaml.safe_load((CHART / "values.yaml").read_text())["resources"]
    return {
        name: (r["requests"]["cpu"], r["requests"]["memory"], r["limits"]["memory"]) for name, r in resources.items()
    }


def _flat(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def test_deploy_md_states_the_charts_requests_and_limits() -> None:
    text = _flat(DEPLOY)
    stated = {
        name: re.findall(rf"the {phrase} requests (\S+) CPU and (\S+) \(limit (\S+)\)", text)
        for name, phrase in (
            ("agent", "agent container"),
            ("relay", "relay container"),
            ("init", "init container"),
        )
    }
    assert stated == {name: [figures] for name, figures in _chart_resources().items()}


def test_every_mention_of_the_daemonsets_memory_limit_is_the_charts() -> None:
    limit = _chart_resources()["agent"][2]
    for path in LIMIT_DOCS:
        text = _flat(path)
        # Old forms that presented another figure as the DaemonSet's limit.
        assert not re.search(r"DaemonSet's \d+ ?Mi(B)? limit|\d+ ?Mi(B)? \(the DaemonSet's limit\)", text), path
        for figure in re.findall(r"DaemonSet's memory limit (?:is now|when measured; now) (\d+Mi)", text):
            assert figure == limit, f"{path.name}: {figure} != the chart's {limit}"
    mentions = sum(len(re.findall(r"DaemonSet's memory limit", _flat(p))) for p in LIMIT_DOCS)
    assert mentions >= 3, "plugins/README.md and checks-exec.md say which limit their measurements ran under"


def _kmsg_example() -> bytes:
    text = RULE_PACKS.read_text(encoding="utf-8")
    section = text[text.index("## A kmsg-format file (`--kmsg-path FILE`)") :]
    block = section.split("```\n", 2)[1]
    return block.encode()


def test_the_kmsg_format_example_parses_as_documented() -> None:
    parsed = decode(_kmsg_example(), mode=Mode.FILE, boot_time=1_000.0)
    assert parsed.errors == [] and parsed.bad_lines == []
    rows = [
        (r.seq, r.facility, r.priority, r.monotonic_usec, r.timestamp, r.continuation, r.fields) for r in parsed.records
    ]
    assert rows == [
        (1001, 0, 6, 1234567890, 1_000.0 + 1234567890 / 1e6, False, {}),
        (1002, 0, 3, 1234568001, 1_000.0 + 1234568001 / 1e6, False, {}),
        (
            1003,
            0,
            4,
            1234569002,
            1_000.0 + 1234569002 / 1e6,
            False,
            {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:0c:00.0"},
        ),
    ]
    assert parsed.records[2].message == "mlx5_core 0000:0c:00.0: port module event:\tmodule 0, Cable unplugged"


def test_simulate_finds_what_the_kmsg_format_section_says() -> None:
    section = RULE_PACKS.read_text(encoding="utf-8").split("## A kmsg-format file", 1)[1].split("\n## ", 1)[0]
    (said,) = re.findall(r"shows what the agent would find: here (.+?)\.\n", section, re.S)
    rule_set = load_rule_set([builtin_plugins_dir()])
    lines = iter(_kmsg_example().decode().splitlines())
    found = [f["reason"] for f in simulate_lines(rule_set=rule_set, lines=lines)]
    assert found == re.findall(r"`(\w+)`", said)
