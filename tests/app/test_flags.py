"""Each flag of ``run`` is declared once (agent/app/flags.py): the table fills every Settings field, generates
the parser and the environment defaults, and docs/configuration.md is the reference it generates."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.app.cli import build_parser, main
from agent.app.flags import LOG_LEVEL, RUN_FLAGS, Flag, flag, from_env, reference
from agent.app.flagvalues import Listen
from agent.app.settings import Settings, build_settings
from agent.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """None of the variables the table reads, whatever the machine running the tests sets."""
    for f in (*RUN_FLAGS, LOG_LEVEL):
        for var in f.env:
            monkeypatch.delenv(var, raising=False)


def settings(*argv: str) -> Settings:
    return build_settings(build_parser().parse_args(["run", *argv]))


def test_the_committed_reference_is_the_generated_one():
    committed = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == reference(), (
        "docs/configuration.md is out of step with agent/app/flags.py; regenerate it: .venv/bin/python -c "
        "\"from agent.app.flags import reference; print(reference(), end='')\" > docs/configuration.md"
    )


def test_the_flags_fill_every_settings_field_and_only_those():
    filled = {f.field for f in RUN_FLAGS}
    assert filled == {field.name for field in dataclasses.fields(Settings)}
    assert len({f.name for f in RUN_FLAGS}) == len(RUN_FLAGS)  # declared once


def test_every_run_flag_is_in_run_help_and_in_the_reference(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = capsys.readouterr().out
    text = reference()
    for f in (*RUN_FLAGS, LOG_LEVEL):
        assert f"--{f.name}" in shown
        assert f"| `--{f.name}" in text, f"--{f.name} has no row in docs/configuration.md"
        for var in f.env:
            assert f"`{var}`" in text


# One value per flag, given through its (first) variable: (variable, value, Settings field, expected).
THROUGH_THE_ENVIRONMENT = [
    ("NHA_CONFIG", "{tmp}", "config_files", "{tmp}"),
    ("NHA_PACKS", "kernel", "plugins_dirs", "kernel"),
    ("NHA_SYS_ROOT", "{tmp}", "sys_root", "{tmp}"),
    ("NHA_DEV_ROOT", "{tmp}", "dev_root", "{tmp}"),
    ("NHA_INSTANCE_TYPE", " trn1.32xlarge ", "instance_type", "trn1.32xlarge"),
    ("NHA_CHECK_CONCURRENCY", "9", "check_concurrency", 9),
    ("NHA_WATCH_CONFIG", "false", "watch_config", False),
    ("NHA_STANDALONE", "true", "standalone", True),
    ("NHA_KMSG_PATH", "/k", "kmsg_path", Path("/k")),
    ("NHA_BOOT_ID_FILE", "/b", "boot_id_file", Path("/b")),
    ("NHA_KMSG_RELAY", "/run/relay.sock", "kmsg_relay", Path("/run/relay.sock")),
    ("NHA_LISTEN", "127.0.0.1:9", "listen", Listen(host="127.0.0.1", port=9)),
    ("NHA_SERVE_CONDITIONS", "true", "serve_conditions", True),
    ("NHA_STATE_DIR", "/s", "state_dir", Path("/s")),
    ("NHA_LOOKBACK", "2m", "lookback", 120.0),
    ("NHA_STALL_TIMEOUT", "1m", "stall_timeout", 60.0),
    ("NHA_AGGREGATE_CONDITION", "true", "aggregate_condition", True),
    ("NHA_NODE_NAME", "n-1", "node_name", "n-1"),
    ("NHA_KUBECONFIG", "/kc", "kubeconfig", Path("/kc")),
    ("NHA_SERVICE_ACCOUNT_DIR", "/sa", "service_account_dir", Path("/sa")),
    ("NHA_EVENT_NAMESPACE", "default", "event_namespace", "default"),
    ("NHA_HEARTBEAT", "1m", "heartbeat", 60.0),
    ("NHA_CLEAR_POLL", "5s", "clear_poll", 5.0),
    ("NHA_API_WAIT_TIMEOUT", "5s", "api_wait_timeout", 5.0),
    ("NHA_DELETE_CONDITIONS", "OldA,OldB", "delete_conditions", ("OldA", "OldB")),
    ("ENABLE_RECOVERY", "TRUE", "enable_recovery", True),
    ("CLUSTER_NAME", "fleet-1", "cluster_name", "fleet-1"),
    ("NHA_CLUSTER_NAME", "fleet-2", "cluster_name", "fleet-2"),
    ("RECOVERY_STARTUP_DELAY", "2m", "recovery_startup_delay", 120.0),
    ("NHA_RECOVERY_POLICY", "{tmp}/policy.yaml", "recovery_policy", "{tmp}/policy.yaml"),
    ("NHA_CLOUDWATCH", "false", "cloudwatch", False),
    ("NHA_SCHEDULED_MAINTENANCE", "true", "scheduled_maintenance", True),
    ("NHA_DIAGNOSTICS_KEEP", "7", "diagnostics_keep", 7),
    ("NHA_DIAGNOSTICS_S3", "s3://bundles/p", "diagnostics_s3", "s3://bundles/p"),
    ("POD_NAMESPACE", "ops", "pod_namespace", "ops"),
    ("DEVICE_HOLDERS", "true", "device_holders", True),
    ("NHA_ACTIVE_CHECK_SHARE", "25%", "active_check_share", 0.25),
    (
        "POD_RESOURCES_SOCKET",
        "/host/pod-resources/kubelet.sock",
        "pod_resources_socket",
        "/host/pod-resources/kubelet.sock",
    ),
]


@pytest.mark.parametrize(("var", "value", "field", "expected"), THROUGH_THE_ENVIRONMENT, ids=lambda x: str(x))
def test_each_variable_reaches_its_settings_field(monkeypatch, tmp_path, var, value, field, expected):
    (tmp_path / "policy.yaml").write_text("rules: []\n")
    monkeypatch.setenv(var, value.replace("{tmp}", str(tmp_path)))
    got = getattr(settings(), field)
    if field == "plugins_dirs":
        got = ",".join(p.name for p in got)
    elif field == "config_files":
        (got,) = got
    if isinstance(expected, str) and "{tmp}" in expected:
        expected = Path(expected.replace("{tmp}", str(tmp_path)))
    assert got == expected


def test_the_table_above_sets_every_variable_of_a_settings_flag():
    """A new flag gets a row there."""
    covered = {var for var, *_ in THROUGH_THE_ENVIRONMENT}
    assert [f.name for f in RUN_FLAGS if f.env and not set(f.env) <= covered] == []


@pytest.mark.parametrize(
    ("argv", "env", "field", "expected"),
    [
        (["--lookback", "1m"], {"NHA_LOOKBACK": "2m"}, "lookback", 60.0),  # the flag wins
        (["--namespace", "a"], {"POD_NAMESPACE": "b"}, "pod_namespace", "a"),
        ([], {"CLUSTER_NAME": "", "NHA_CLUSTER_NAME": "x"}, "cluster_name", "x"),  # empty: the next variable
        ([], {"CLUSTER_NAME": "a", "NHA_CLUSTER_NAME": "x"}, "cluster_name", "a"),  # the first one set wins
        ([], {"POD_NAMESPACE": ""}, "pod_namespace", "node-health-agent"),
        (["--pack", "nvidia"], {"NHA_PACKS": "kernel"}, "plugins_dirs", ("nvidia",)),  # --pack: env when not given
        (["--delete-condition", "A"], {"NHA_DELETE_CONDITIONS": "B, C"}, "delete_conditions", ("A", "B", "C")),
    ],
)
def test_which_value_wins(monkeypatch, argv, env, field, expected):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    got = getattr(settings(*argv), field)
    assert (tuple(p.name for p in got) if field == "plugins_dirs" else got) == expected


def test_an_empty_variable_counts_as_set():
    f = flag("lookback")
    assert (from_env(f, {}), from_env(f, {"NHA_LOOKBACK": ""}), from_env(f, {"NHA_LOOKBACK": "1m"})) == ("5m", "", "1m")


# A refused value names the flag and the variable the user set: (argv, env, the problem's file).
REFUSED = [
    (["--listen", "x:y"], {}, "--listen / NHA_LISTEN"),
    ([], {"NHA_HEARTBEAT": "1s"}, "--heartbeat / NHA_HEARTBEAT"),
    (["--check-concurrency", "0"], {}, "--check-concurrency / NHA_CHECK_CONCURRENCY"),
    (["--sys-root", "/no/such/dir"], {}, "--sys-root / NHA_SYS_ROOT"),
    (["--delete-condition", "Ready"], {}, "--delete-condition / NHA_DELETE_CONDITIONS"),
    (["--pack", "nosuch"], {}, "--pack / NHA_PACKS"),
    (["--plugins-dir", "/no/such/dir"], {}, "--plugins-dir / NHA_PLUGINS_DIR"),
    ([], {"ENABLE_RECOVERY": "yes"}, "--enable-recovery / ENABLE_RECOVERY"),
    (["--standalone"], {"ENABLE_RECOVERY": "true"}, "--enable-recovery / ENABLE_RECOVERY"),
    ([], {"CLUSTER_NAME": "a b"}, "--cluster-name / CLUSTER_NAME"),
    ([], {"RECOVERY_STARTUP_DELAY": "soon"}, "--recovery-startup-delay / RECOVERY_STARTUP_DELAY"),
    (["--cloudwatch", "true"], {}, "--cloudwatch / NHA_CLOUDWATCH"),  # no cluster name
    ([], {"POD_NAMESPACE": "Not_A_Namespace"}, "--namespace / POD_NAMESPACE"),
]


@pytest.mark.parametrize(("argv", "env", "file"), REFUSED)
def test_a_refused_value_names_the_flag_and_its_variable(monkeypatch, argv, env, file):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as refused:
        settings(*argv)
    assert [p.file for p in refused.value.problems] == [file]


def test_every_refused_value_is_reported_at_once():
    with pytest.raises(ConfigError) as refused:
        settings("--lookback", "soon", "--pack", "nosuch", "--diagnostics-keep", "-1")
    assert [p.file for p in refused.value.problems] == [
        "--pack / NHA_PACKS",
        "--lookback / NHA_LOOKBACK",
        "--diagnostics-keep / NHA_DIAGNOSTICS_KEEP",
    ]


def test_a_flag_is_a_frozen_declaration():
    with pytest.raises(dataclasses.FrozenInstanceError):
        flag("listen").default = "0"  # type: ignore[misc]
    assert all(isinstance(f, Flag) for f in RUN_FLAGS)


def test_device_holders_are_off_by_default_and_the_socket_is_the_kubelets():
    got = settings()
    assert (got.device_holders, got.pod_resources_socket) == (False, "/var/lib/kubelet/pod-resources/kubelet.sock")


def test_the_pod_resources_socket_must_be_an_absolute_path():
    with pytest.raises(ConfigError, match="POD_RESOURCES_SOCKET"):
        settings("--pod-resources-socket", "kubelet.sock")
