"""A rule pack's ``cloudwatchNamespace``: where its conditions' problems are published (default NeuronHealthCheck)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.app.config import load_rule_set
from agent.core.errors import ConfigError

PACK = """\
source: my-fleet
{namespace}conditions:
  - type: FanHealth
    reason: FansOk
    message: fans turn
rules:
  - type: permanent
    condition: FanHealth
    reason: FanStopped
    pattern: 'fan \\d+ stopped'
"""


@pytest.mark.parametrize(
    ("line", "expected"),
    [("", None), ("cloudwatchNamespace: MyFleet/Health\n", "MyFleet/Health")],
    ids=["default", "set"],
)
def test_the_namespace_travels_with_the_packs_conditions(tmp_path: Path, line: str, expected: str | None) -> None:
    path = tmp_path / "fans.yaml"
    path.write_text(PACK.format(namespace=line))
    (spec,) = [c for c in load_rule_set([path]).conditions if c.type == "FanHealth"]
    assert spec.cloudwatch_namespace == expected


@pytest.mark.parametrize("value", ["AWS/EC2", "has space", "''", "[a]", "x" * 256])
def test_a_bad_namespace_is_a_configuration_error_naming_the_field(tmp_path: Path, value: str) -> None:
    path = tmp_path / "fans.yaml"
    path.write_text(PACK.format(namespace=f"cloudwatchNamespace: {value}\n"))
    with pytest.raises(ConfigError) as caught:
        load_rule_set([path])
    (problem,) = caught.value.problems
    assert (problem.file, problem.line, problem.field) == (str(path), 2, "cloudwatchNamespace")
    assert "must be a CloudWatch namespace" in problem.message
