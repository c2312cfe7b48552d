"""The flags of issue 15's maintenance and evidence part: --scheduled-maintenance, --diagnostics-keep,
--diagnostics-s3 (and their NHA_* variables): defaults, values, and what is refused before anything runs."""

from __future__ import annotations

import pytest

from agent.app.cli import build_parser
from agent.app.settings import build_settings
from agent.core.errors import ConfigError

NAMES = ("NHA_SCHEDULED_MAINTENANCE", "NHA_DIAGNOSTICS_KEEP", "NHA_DIAGNOSTICS_S3")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)


def settings(*argv: str):
    return build_settings(build_parser().parse_args(["run", "--standalone", *argv]))


def test_defaults():
    s = settings()
    assert (s.scheduled_maintenance, s.diagnostics_keep, s.diagnostics_s3) == (False, 5, "")


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--scheduled-maintenance", "true"], {}, (True, 5, "")),
        ([], {"NHA_SCHEDULED_MAINTENANCE": "true"}, (True, 5, "")),
        (["--diagnostics-keep", "0"], {}, (False, 0, "")),
        ([], {"NHA_DIAGNOSTICS_KEEP": "20"}, (False, 20, "")),
        (["--diagnostics-s3", "s3://evidence/fleet"], {}, (False, 5, "s3://evidence/fleet")),
        ([], {"NHA_DIAGNOSTICS_S3": "s3://evidence"}, (False, 5, "s3://evidence")),
    ],
)
def test_values(monkeypatch, argv, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s = settings(*argv)
    assert (s.scheduled_maintenance, s.diagnostics_keep, s.diagnostics_s3) == expected


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--scheduled-maintenance", "perhaps"], "--scheduled-maintenance"),
        (["--diagnostics-keep", "-1"], "--diagnostics-keep"),
        (["--diagnostics-keep", "101"], "must be an integer from 0 to 100"),
        (["--diagnostics-s3", "https://evidence/fleet"], "is not s3://BUCKET/PREFIX"),
        (["--diagnostics-s3", "s3://evidence/a/../b"], "'..' parts are not allowed"),
    ],
)
def test_refused(argv, said):
    with pytest.raises(ConfigError) as refused:
        settings(*argv)
    assert said in str(refused.value)
