"""Hostile configuration files (issue 13 #3, #4): every file the agent reads as configuration is a
regular file of bounded size holding a bounded document, at start and on every reload; anything else
is refused with the file (and line) named, exit 2, and a reload keeps the last good configuration.

Inputs that would cost gigabytes or block without the bounds (the alias bomb, /dev/zero, a FIFO, a
50 MB pack) run only in a subprocess under an address-space limit and a timeout; the rest are
bounded by construction (each fails fast on a reader without the bounds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.core.configdoc import read_pack
from agent.core.configfiles import read_config_files
from agent.core.docreader import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES

from helpers import http_get, memory_limit, start_standalone_agent, wait_for

pytestmark = pytest.mark.slow  # starts agent processes

GiB = 1 << 30
LIMIT = GiB  # the address space a child may use (the agent idles at ~180 MB of it)

# 352 bytes that stand for 9^9 (387 million) strings: "billion laughs".
BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
rules: *i
"""

PACK = """\
conditions:
  - {type: Thing, reason: ThingOk, message: fine}
rules:
  - {type: permanent, condition: Thing, reason: AlphaSeen, pattern: 'alpha .*'}
"""


def nested_block(levels: int) -> str:
    """``levels`` block mappings inside each other, one per line."""
    return "".join(f"{' ' * i}k{i}:\n" for i in range(levels)) + f"{' ' * levels}v\n"


# ---- documents: bounded by construction -----------------------------------------------------------------

REFUSED = [
    # (file name, text, line, the message starts with)
    ("recursive.yaml", "a: &a [*a]\n", 1, "alias *a is inside the node it names (a recursive document)"),
    ("merge.yaml", "a: &a {b: 1, <<: *a}\n", 1, "alias *a is inside the node it names"),
    ("deep-flow.yaml", "rules: " + "[" * 600 + "]" * 600, 1, f"nested more than {MAX_DEPTH} levels deep"),
    ("deep-block.yaml", nested_block(MAX_DEPTH + 1), MAX_DEPTH + 1, f"nested more than {MAX_DEPTH} levels deep"),
    # libyaml gives up on 1,000 levels before the scan counts 33: the JSON reader refuses it, with no line
    ("deep.json", "[" * 3000 + "]" * 3000, None, f"nested more than {MAX_DEPTH} levels deep"),
    ("deep-33.json", "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), 1, f"nested more than {MAX_DEPTH} levels"),
    # JSON that YAML cannot read (a DEL character in a string) is bounded by the JSON reader alone: no line
    ("deep-past-recursion.json", '["\x7f", ' + "[" * 3000 + "]" * 3001, None, f"nested more than {MAX_DEPTH} levels"),
    ("deep-33-escaped.json", '["\x7f", ' + "[" * MAX_DEPTH + "]" * (MAX_DEPTH + 1), None, "nested more than"),
    ("wide-escaped.json", '["\x7f", ' + "0," * MAX_NODES + "0]", None, f"the document has more than {MAX_NODES:,}"),
    ("wide.yaml", "rules: [" + "0," * MAX_NODES + "0]", 1, f"the document has more than {MAX_NODES:,} nodes"),
    ("wide.json", "[" + "0," * MAX_NODES + "0]", 1, f"the document has more than {MAX_NODES:,} nodes"),
    ("aliases.yaml", "x: &x [1, 2, 3, 4, 5, 6, 7, 8, 9]\ny: [" + "*x, " * 2500 + "]", 2, "the document has more"),
    ("huge-int.yaml", "rules: []\nx: " + "9" * 5000 + "\n", None, "invalid YAML: exceeds the limit (4300 digits)"),
    ("huge-int.json", '{"rules": [], "x": ' + "9" * 5000 + "}", None, "invalid JSON: exceeds the limit (4300"),
    ("big.yaml", "#" * MAX_FILE_BYTES + "\n", None, f"is {MAX_FILE_BYTES + 1:,} bytes: a configuration file"),
]


@pytest.mark.parametrize(("name", "text", "line", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_document_past_a_bound_is_refused_with_file_and_line(tmp_path, name, text, line, message):
    path = tmp_path / name
    path.write_text(text)
    doc, problems = read_pack(path)
    assert doc is None
    [problem] = problems
    assert (problem.file, problem.field, problem.line) == (str(path), "", line)
    assert problem.message.startswith(message), problem.message


ACCEPTED = [
    # (file name, text, nodes)
    ("at-node-bound.yaml", "[" + "0," * (MAX_NODES - 2) + "0]", MAX_NODES),
    ("at-node-bound.json", "[" + "0," * (MAX_NODES - 2) + "0]", MAX_NODES),
    ("at-depth-bound.yaml", nested_block(MAX_DEPTH), None),
    ("at-depth-bound.json", "[" * MAX_DEPTH + "]" * MAX_DEPTH, MAX_DEPTH),
    ("at-size-bound.yaml", "#" * (MAX_FILE_BYTES - 1) + "\n", 0),
    ("anchors.yaml", "x: &x {a: 1}\ny: *x\n", 9),  # root + 2 keys + x (3) + what *x stands for (3)
]


@pytest.mark.parametrize(("name", "text", "nodes"), ACCEPTED, ids=[r[0] for r in ACCEPTED])
def test_a_document_within_the_bounds_is_read(tmp_path, name, text, nodes):
    path = tmp_path / name
    path.write_text(text)
    doc, problems = read_pack(path)
    assert problems == [] and doc is not None
    if nodes is not None:
        assert doc.nodes == nodes
    assert doc.size == len(text.encode())


def test_a_problem_inside_an_alias_points_at_its_anchor(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("shared: &rule {type: temporary, reason: R, pattern: 'a('}\nrules:\n  - *rule\n")
    doc, _ = read_pack(path)
    assert doc is not None and doc.data["rules"] == [doc.data["shared"]]
    assert doc.line(("rules", 0, "pattern")) == 1


def test_a_symlink_to_a_regular_file_is_read(tmp_path):
    """A mounted ConfigMap is symlinks (pack.yaml -> ..data/pack.yaml)."""
    (tmp_path / "real.yaml").write_text(PACK)
    (tmp_path / "pack.yaml").symlink_to("real.yaml")
    doc, problems = read_pack(tmp_path / "pack.yaml")
    assert problems == [] and doc is not None and doc.data["rules"][0]["reason"] == "AlphaSeen"


# ---- many files --------------------------------------------------------------------------------------


def test_too_many_files_are_a_problem_naming_the_first_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.core.configdoc.MAX_FILES", 3)
    for n in range(5):
        (tmp_path / f"p{n}.yaml").write_text("rules: []\n")
    files, problems = read_config_files([tmp_path])
    assert [f.path.name for f in files] == ["p0.yaml", "p1.yaml", "p2.yaml"]
    assert [(p.file, p.message) for p in problems] == [
        (str(tmp_path / "p3.yaml"), "more than 3 configuration files in all: this one and those after it are not read")
    ]


def test_a_directory_of_too_many_entries_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr("agent.core.configdoc.MAX_DIR_ENTRIES", 3)
    (tmp_path / "big").mkdir()
    for n in range(4):
        (tmp_path / "big" / f"junk{n}").touch()
    (tmp_path / "pack.yaml").write_text("rules: []\n")
    files, problems = read_config_files([tmp_path])
    assert [f.path.name for f in files] == ["pack.yaml"]
    assert [(p.file, p.message) for p in problems] == [
        (str(tmp_path / "big"), "has more than 3 entries: not read (is it really a plugin directory?)")
    ]


def test_directories_nested_too_deep_are_not_read(tmp_path):
    deep = tmp_path.joinpath(*[f"d{n}" for n in range(20)])
    deep.mkdir(parents=True)
    (deep / "pack.yaml").write_text("rules: []\n")
    (tmp_path / "pack.yaml").write_text("rules: []\n")
    files, problems = read_config_files([tmp_path])
    assert [f.path for f in files] == [tmp_path / "pack.yaml"]
    assert [(p.file, p.message) for p in problems] == [
        (str(tmp_path.joinpath(*[f"d{n}" for n in range(17)])), "is nested more than 16 directories deep: not read")
    ]


@pytest.mark.parametrize(("bound", "value"), [("MAX_TOTAL_NODES", 25), ("MAX_TOTAL_BYTES", 100)])
def test_all_files_together_are_bounded(tmp_path, monkeypatch, bound, value):
    monkeypatch.setattr(f"agent.core.configfiles.{bound}", value)
    for n in range(4):  # 10 nodes and 32 bytes each
        (tmp_path / f"p{n}.yaml").write_text("rules: [{a: 1, b: 2}, 3]\nx: 1234\n")
    files, problems = read_config_files([tmp_path])
    crossing = 2 if bound == "MAX_TOTAL_NODES" else 3
    assert len(files) == crossing
    [problem] = problems
    assert problem.file == str(tmp_path / f"p{crossing}.yaml")
    assert "it and those after it are not read" in problem.message


# ---- the commands: each hostile file, wherever it is configuration, exits 2 naming it ---------------------


def bomb(path: Path) -> str:
    path.write_text(BOMB)
    return "the document has more than 20,000 nodes counting what its aliases stand for"


def fifo(path: Path) -> str:
    os.mkfifo(path)
    return "is a FIFO (named pipe): configuration files must be regular files"


def dev_zero(path: Path) -> str:
    path.symlink_to("/dev/zero")
    return "is a character device: configuration files must be regular files"


def fifty_mb(path: Path) -> str:
    with path.open("wb") as f:
        f.truncate(50 << 20)  # sparse: no disk
    return f"is 52,428,800 bytes: a configuration file may be at most {MAX_FILE_BYTES:,} bytes"


HOSTILE: dict[str, Callable[[Path], str]] = {"bomb": bomb, "fifo": fifo, "dev-zero": dev_zero, "50mb": fifty_mb}
PLACES = ["config", "plugins-dir", "recovery-policy"]


def run_agent(args: list[str], *, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=memory_limit(LIMIT),
        cwd=tmp,
    )


@pytest.mark.parametrize("command", ["validate-config", "run"])
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_a_hostile_file_exits_2_naming_it(tmp_path, command, place, hostile):
    good = tmp_path / "good"
    good.mkdir()
    (good / "pack.yaml").write_text(PACK)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    path = (plugins if place == "plugins-dir" else tmp_path) / "hostile.yaml"
    message = HOSTILE[hostile](path)
    args = [command, "--plugins-dir", str(plugins if place == "plugins-dir" else good)]
    if place == "recovery-policy":
        args += ["--recovery-policy", str(path)]
    elif place == "config":
        args += [str(path)] if command == "validate-config" else ["--config", str(path)]
    if command == "run":
        (tmp_path / "kmsg").touch()
        args += ["--standalone", "--kmsg-path", str(tmp_path / "kmsg"), "--state-dir", str(tmp_path / "state")]
        args += ["--listen", "0"]
    done = run_agent(args, tmp=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{path}" in done.stderr and message in done.stderr, done.stderr[-2000:]


# ---- a hot reload of a hostile file: rejected, the last good configuration keeps running ----------------


def _metric(base: str, name: str) -> float | None:
    _, body = http_get(f"{base}/metrics")
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _watcher_error(base: str) -> str:
    _, body = http_get(f"{base}/healthz")
    return json.loads(body or "{}").get("details", {}).get("config_watcher", "")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_hot_reload_of_a_hostile_file_is_rejected_and_the_last_good_configuration_kept(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    pack = plugins / "pack.yaml"
    pack.write_text(PACK)
    proc, base = start_standalone_agent(tmp_path, plugins=plugins, max_memory=LIMIT)
    try:
        wait_for(lambda: _metric(base, "node_health_agent_config_generation") == 1.0, timeout=30)
        for n, hostile in enumerate(HOSTILE.values(), start=1):
            pack.unlink()
            message = hostile(pack)
            wait_for(lambda n=n: _metric(base, "node_health_agent_config_reload_failures_total") == n, timeout=30)
            assert f"{pack}" in _watcher_error(base) and message in _watcher_error(base)
            assert _metric(base, "node_health_agent_config_generation") == 1.0
            assert _rss_mib(proc.pid) < 192  # the DaemonSet's memory limit
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        with (tmp_path / "kmsg").open("a") as f:  # the last good rules still match
            f.write(f"3,1,{usec},-;alpha particle\n")
        _, body = wait_for(lambda: (r := http_get(f"{base}/conditions")) and "AlphaSeen" in r[1] and r, timeout=30)
        pack.unlink()
        pack.write_text(PACK.replace("alpha", "gamma"))
        wait_for(lambda: _metric(base, "node_health_agent_config_generation") == 2.0, timeout=30)
        assert _watcher_error(base) == ""
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
