"""Rule packs: loading, validation (every problem names file, field and line), NPD compatibility
and the override semantics of later packs."""

from __future__ import annotations

import errno
import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from agent.app.cli import main
from agent.app.config import load_rule_set
from agent.core import configdoc as packfile
from agent.core.errors import ConfigError, ConfigProblem
from agent.core.types import RuleType, Severity
from agent.detectors.rules import RuleEngine

from helpers import FIXTURES, REPO
from helpers.npd import NPD_KERNEL_MONITOR

ROOT = REPO
PACKS = FIXTURES / "packs"
TESTDATA = ROOT.parent / "shared" / "testdata"
TOOL_OUTPUTS = TESTDATA / "tool-outputs"

needs_testdata = pytest.mark.skipif(not TOOL_OUTPUTS.is_dir(), reason=f"shared test data not present at {TOOL_OUTPUTS}")


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def problems(paths: list[Path]) -> tuple[ConfigProblem, ...]:
    with pytest.raises(ConfigError) as excinfo:
        load_rule_set(paths)
    return excinfo.value.problems


def tool_output(name: str) -> str:
    """A tool-output file without its '# ' header (everything up to and including the ---8<--- line)."""
    lines = (TOOL_OUTPUTS / name).read_text(encoding="utf-8").splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "---8<---" in line)
    return "".join(lines[cut + 1 :])


# --------------------------------------------------------------------------------------------
# Validation: one bad pack per row → the exact problems (field, line, part of the message)

BAD_PACKS = [
    # (id, file name, text, [(field, line, message part), ...])
    (
        "invalid-yaml",
        "p.yaml",
        """
        rules:
          - name: a
           type: temporary
        """,
        [("", 3, "invalid YAML")],
    ),
    ("invalid-json", "p.json", '{\n  "rules": [\n    }\n', [("", 3, "invalid JSON")]),
    ("not-a-mapping", "p.yaml", "- a\n- b\n", [("", 1, "expected a mapping")]),
    ("empty-file", "p.yaml", "", [("rules", None, "required")]),
    ("rules-not-a-list", "p.yaml", "rules: {a: 1}\n", [("rules", 1, "must be a list")]),
    ("rule-not-a-mapping", "p.yaml", "rules:\n  - just text\n", [("rules[0]", 2, "must be a mapping")]),
    (
        "unknown-top-level-key",
        "p.yaml",
        """
        rule:
          - type: temporary
        rules: []
        """,
        [("rule", 1, "unknown key 'rule'")],
    ),
    (
        "unknown-rule-key",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            patern: 'x'
        """,
        [("rules[0].patern", 4, "unknown key 'patern'"), ("rules[0].pattern", 2, "required")],
    ),
    (
        "unknown-condition-key",
        "p.yaml",
        """
        conditions:
          - type: C
            reason: CIsFine
            messsage: typo
        rules: []
        """,
        [("conditions[0].messsage", 4, "unknown key 'messsage'")],
    ),
    (
        "condition-without-reason",
        "p.yaml",
        """
        conditions:
          - type: C
        rules: []
        """,
        [("conditions[0].reason", 2, "required")],
    ),
    (
        "plugin-unknown",
        "p.yaml",
        "plugin: syslog\nrules: []\n",
        [("plugin", 1, "plugin 'syslog' is not one node-health-agent runs (kmsg, filelog, journald or custom)")],
    ),
    (
        "bad-type",
        "p.yaml",
        """
        rules:
          - type: transient
            reason: R
            pattern: 'x'
        """,
        [("rules[0].type", 2, "must be 'temporary' or 'permanent'")],
    ),
    (
        "missing-type",
        "p.yaml",
        """
        rules:
          - reason: R
            pattern: 'x'
        """,
        [("rules[0].type", 2, "must be 'temporary' or 'permanent'")],
    ),
    (
        "permanent-without-condition",
        "p.yaml",
        """
        rules:
          - type: permanent
            reason: R
            pattern: 'x'
        """,
        [("rules[0].condition", 2, "required for a permanent rule")],
    ),
    (
        "permanent-undeclared-condition",
        "p.yaml",
        """
        conditions:
          - {type: Declared, reason: DeclaredIsFine, message: ok}
        rules:
          - type: permanent
            condition: Undeclared
            reason: R
            pattern: 'x'
        """,
        [("rules[0].condition", 5, "'Undeclared' is not declared")],
    ),
    (
        "temporary-with-condition",
        "p.yaml",
        """
        conditions:
          - {type: C, reason: CIsFine, message: ok}
        rules:
          - type: temporary
            condition: C
            reason: R
            pattern: 'x'
        """,
        [("rules[0].condition", 5, "only permanent rules set a condition")],
    ),
    (
        "missing-pattern",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
        """,
        [("rules[0].pattern", 2, "required")],
    ),
    (
        "empty-pattern",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: ''
        """,
        [("rules[0].pattern", 4, "must not be empty: node-problem-detector accepts an empty pattern")],
    ),
    (
        "pattern-not-a-string",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: [a, b]
        """,
        [("rules[0].pattern", 4, "required")],
    ),
    (
        "pattern-unbalanced",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (\\d+'
        """,
        [("rules[0].pattern", 4, "invalid regular expression")],
    ),
    (
        "pattern-lookahead",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'EDAC MC\\d+: \\d+ CE (?!memory read error).*'
        """,
        [("rules[0].pattern", 4, "look-around assertions are not supported: rule patterns are RE2/Go syntax")],
    ),
    (
        "pattern-backreference",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: '(\\w+) again \\1'
        """,
        [("rules[0].pattern", 4, "backreferences are not supported")],
    ),
    (
        "pattern-program-too-large",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: '\\pL{1000}'
        """,
        [("rules[0].pattern", 4, "pattern is too large")],
    ),
    (
        "pattern-duplicate-group",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: '(?P<dev>a)|(?P<dev>b)'
        """,
        [("rules[0].pattern", 4, "duplicate group name 'dev'")],
    ),
    (
        "duplicate-condition-type",
        "p.yaml",
        """
        conditions:
          - {type: GpuHealth, reason: GpuIsHealthy, message: ok}
          - {type: DiskHealth, reason: DiskIsHealthy, message: ok}
          - {type: GpuHealth, reason: GpuIsFine, message: fine}
        rules: []
        """,
        [("conditions[2].type", 4, "duplicate condition type 'GpuHealth' (also conditions[0].type, line 2)")],
    ),
    (
        "missing-reason",
        "p.yaml",
        """
        rules:
          - type: temporary
            pattern: 'x'
        """,
        [("rules[0].reason", 2, "required")],
    ),
    (
        "reason-with-spaces",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: has an error
            pattern: 'x'
        """,
        [("rules[0].reason", 3, "CamelCase")],
    ),
    (
        "reason-unknown-field",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: 'GpuXid{code}'
            pattern: 'Xid (?P<xid>\\d+)'
        """,
        [("rules[0].reason", 3, "unknown field 'code'")],
    ),
    (
        "reason-unclosed-template",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: 'GpuXid{xid'
            pattern: 'Xid (?P<xid>\\d+)'
        """,
        [("rules[0].reason", 3, "invalid template")],
    ),
    (
        "bad-severity",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            severity: fatal
            pattern: 'x'
        """,
        [("rules[0].severity", 4, "must be one of info, warning, error, critical")],
    ),
    (
        "suffix-not-a-string",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'x'
            patternGeneratedMessageSuffix: [a]
        """,
        [("rules[0].patternGeneratedMessageSuffix", 5, "must be a string")],
    ),
    (
        "bad-rule-name",
        "p.yaml",
        """
        rules:
          - name: 'has space'
            type: temporary
            reason: R
            pattern: 'x'
        """,
        [("rules[0].name", 2, "must be a name")],
    ),
    (
        "enabled-not-bool",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'x'
            enabled: 'no way'
        """,
        [("rules[0].enabled", 5, "must be true or false")],
    ),
    ("buffer-size-zero", "p.yaml", "bufferSize: 0\nrules: []\n", [("bufferSize", 1, "between 1 and 1000")]),
    ("buffer-size-too-big", "p.yaml", "bufferSize: 1001\nrules: []\n", [("bufferSize", 1, "between 1 and 1000")]),
    ("buffer-size-string", "p.json", '{"bufferSize": "10", "rules": []}', [("bufferSize", 1, "between 1 and 1000")]),
    ("buffer-size-bool", "p.yaml", "bufferSize: true\nrules: []\n", [("bufferSize", 1, "between 1 and 1000")]),
    (
        "bad-header-values",
        "p.yaml",
        """
        source: ''
        lookback: 5x
        delay: -1
        metricsReporting: 'sometimes'
        rules: []
        """,
        [
            ("source", 1, "non-empty string"),
            ("lookback", 2, "invalid duration '5x'"),
            ("delay", 3, "must not be negative"),
            ("metricsReporting", 4, "true or false"),
        ],
    ),
    (
        "clear-after-invalid",
        "p.yaml",
        """
        conditions:
          - type: C
            reason: CIsFine
            message: ok
            clearAfter: soon
        rules: []
        """,
        [("conditions[0].clearAfter", 5, "invalid duration 'soon'")],
    ),
    (
        "clear-after-zero",
        "p.yaml",
        """
        conditions:
          - {type: C, reason: CIsFine, message: ok, clearAfter: 0s}
        rules: []
        """,
        [("conditions[0].clearAfter", 2, "greater than 0")],
    ),
    ("list-not-a-list", "p.yaml", "lists:\n  codes: 79\nrules: []\n", [("lists.codes", 2, "list of strings")]),
    (
        "where-unknown-list",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            where: {xid: {in: nvidia.nope}}
        """,
        [("rules[0].where.xid", 5, "unknown list 'nvidia.nope'")],
    ),
    (
        "where-unknown-list-by-name",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            where: {xid: nvidia.nope}
        """,
        [("rules[0].where.xid", 5, "unknown list 'nvidia.nope'")],
    ),
    (
        "where-unknown-field",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            where: {code: [79]}
        """,
        [("rules[0].where.code", 5, "unknown field 'code'")],
    ),
    (
        "where-in-and-not-in",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            where: {xid: {in: [79], notIn: [13]}}
        """,
        [("rules[0].where.xid", 5, "exactly one of 'in' or 'notIn'")],
    ),
    (
        "where-scalar-value",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            where: {xid: 79}
        """,
        [("rules[0].where.xid", 5, "must be a list of values")],
    ),
    (
        "where-not-a-mapping",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            where: [xid]
        """,
        [("rules[0].where", 5, "must map field names")],
    ),
    (
        "threshold-count-zero",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            threshold: {count: 0, window: 1h}
        """,
        [("rules[0].threshold.count", 5, "integer >= 1")],
    ),
    (
        "threshold-bad-window",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            threshold: {count: 3, window: abc}
        """,
        [("rules[0].threshold.window", 5, "invalid duration 'abc'")],
    ),
    (
        "threshold-missing-window",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            threshold: {count: 3}
        """,
        [("rules[0].threshold.window", 5, "expected a duration")],
    ),
    (
        "threshold-by-unknown-field",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            threshold: {count: 3, window: 1h, by: [xid, pci]}
        """,
        [("rules[0].threshold.by", 5, "unknown field 'pci'")],
    ),
    (
        "threshold-unknown-key",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            threshold: {count: 3, window: 1h, per: xid}
        """,
        [("rules[0].threshold.per", 5, "unknown key")],
    ),
    (
        "threshold-not-a-mapping",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'x'
            threshold: 3
        """,
        [("rules[0].threshold", 5, "must be a mapping")],
    ),
    (
        "duplicate-rule-names",
        "p.yaml",
        """
        rules:
          - name: same
            type: temporary
            reason: R
            pattern: 'x'
          - name: same
            type: temporary
            reason: R
            pattern: 'y'
        """,
        [("rules[1].name", 6, "duplicate rule name 'same' (also rules[0])")],
    ),
    (
        "field-types-unknown-type",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            fieldTypes: {xid: float}
        """,
        [("rules[0].fieldTypes.xid", 5, "must be one of int, hex, str")],
    ),
    (
        "field-types-unknown-field",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'Xid (?P<xid>\\d+)'
            fieldTypes: {code: int}
        """,
        [("rules[0].fieldTypes.code", 5, "unknown field 'code'")],
    ),
    (
        "field-types-not-a-mapping",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'x'
            fieldTypes: [int]
        """,
        [("rules[0].fieldTypes", 5, "must be a mapping")],
    ),
    (
        "key-values-not-a-list",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'x'
            keyValues: nd-id
        """,
        [("rules[0].keyValues", 5, "must be a list of key names")],
    ),
    (
        "reason-format-spec",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: 'GpuXid{xid:x}'
            pattern: 'Xid (?P<xid>\\d+)'
        """,
        [("rules[0].reason", 3, "plain field names only")],
    ),
    (
        "reason-conversion",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: 'GpuXid{xid!r}'
            pattern: 'Xid (?P<xid>\\d+)'
        """,
        [("rules[0].reason", 3, "CamelCase")],
    ),
    (
        "reason-over-128-characters",
        "p.yaml",
        f"""
        rules:
          - type: temporary
            reason: {"R" * 129}
            pattern: 'x'
        """,
        [("rules[0].reason", 3, "129 characters; a reason is at most 128")],
    ),
    (
        "template-over-128-characters",
        "p.yaml",
        f"""
        rules:
          - type: temporary
            reason: '{"R" * 125}{{xid}}'
            pattern: 'Xid (?P<xid>\\d+)'
        """,
        [("rules[0].reason", 3, "130 characters; a reason is at most 128")],
    ),
    (
        "disable-without-name",
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'x'
            enabled: false
        """,
        [("rules[0].enabled", 5, "needs the 'name'")],
    ),
    (
        "disable-with-unknown-key",
        "p.yaml",
        """
        rules:
          - name: kernel/oops
            enabled: false
            because: noisy
        """,
        [("rules[0].because", 4, "unknown key 'because'")],
    ),
    (
        "json-lines",
        "p.json",
        """
        {
          "rules": [
            {
              "type": "temporary",
              "reason": "R",
              "pattern": "a(b"
            }
          ]
        }
        """,
        [("rules[0].pattern", 6, "invalid regular expression")],
    ),
]


@pytest.mark.parametrize(("name", "text", "expected"), [c[1:] for c in BAD_PACKS], ids=[c[0] for c in BAD_PACKS])
def test_bad_pack_is_rejected_with_exact_problems(
    tmp_path: Path, name: str, text: str, expected: list[tuple[str, int | None, str]]
) -> None:
    path = write(tmp_path, name, text)
    found = problems([path])
    assert {p.file for p in found} == {str(path)}
    assert sorted((p.field, p.line) for p in found) == sorted((f, line) for f, line, _ in expected)
    for field, _line, part in expected:
        (problem,) = [p for p in found if p.field == field]
        assert part in problem.message
        assert str(problem).startswith(f"{path}:{problem.line}: " if problem.line else f"{path}: ")


KEY_LINES = """
rules:
  - type: temporary
    reason: R
    pattern: 'Xid (?P<xid>\\d+)'
    where:
      xid:
        in: nvidia.nope
    threshold:
      count: 2
      window:
        - 1h
    extra:
      nested: 1
"""


def test_problem_line_is_the_line_of_the_key(tmp_path: Path) -> None:
    """A field whose value is a block (mapping or list) is reported at its key, not at the value below it."""
    path = write(tmp_path, "p.yaml", KEY_LINES)
    found = problems([path])
    assert sorted((p.field, p.line) for p in found) == [
        ("rules[0].extra", 12),
        ("rules[0].threshold.window", 10),
        ("rules[0].where.xid", 6),
    ]


def test_problem_line_in_tab_indented_json(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "p.json",
        '{\n\t"rules": [\n\t\t{\n\t\t\t"type": "temporary",\n'
        '\t\t\t"reason": "R",\n\t\t\t"pattern": "a(b"\n\t\t}\n\t]\n}\n',
    )
    (problem,) = problems([path])
    assert (problem.field, problem.line) == ("rules[0].pattern", 6)


def test_where_list_with_a_misspelt_list_name_is_rejected(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "p.yaml",
        """
        lists:
          xid.node: [48, 79]
          xid.nvlink: [144]
        rules:
          - type: temporary
            reason: 'GpuXid{xid}'
            pattern: 'Xid (?P<xid>\\d+)'
            where: {xid: {notIn: [xid.node, xid.nvlnk]}}
        """,
    )
    found = problems([path])
    assert [(p.field, p.line) for p in found] == [("rules[0].where.xid", 8)]
    assert "xid.nvlnk" in found[0].message


def test_every_problem_in_a_file_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "p.yaml",
        """
        bufferSize: 0
        conditions:
          - {type: C, reason: CIsFine, message: ok, clearAfter: abc}
        rules:
          - type: transient
            reason: R
            pattern: 'x'
          - type: permanent
            reason: R
            pattern: 'y'
          - type: temporary
            reason: R
            pattern: 'a(b'
            severity: loud
        """,
    )
    found = problems([path])
    assert [(p.field, p.line) for p in found] == [
        ("bufferSize", 1),
        ("conditions[0].clearAfter", 3),
        ("rules[0].type", 5),
        ("rules[1].condition", 8),
        ("rules[2].pattern", 13),
        ("rules[2].severity", 14),
    ]


def test_problems_of_every_file_are_reported(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", "rules:\n  - {type: temporary, reason: R, pattern: 'a(b'}\n")
    broken = write(tmp_path, "b.json", '{"rules": [')
    good = write(tmp_path, "c.yaml", "rules:\n  - {type: temporary, reason: R, pattern: 'fine'}\n")
    last = write(tmp_path, "d.yaml", "plugin: syslog\nrules: []\n")
    found = problems([first, broken, good, last])
    assert sorted((Path(p.file).name, p.field) for p in found) == [
        ("a.yaml", "rules[0].pattern"),
        ("b.json", ""),
        ("d.yaml", "plugin"),
    ]


def test_config_error_message_lists_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", "bufferSize: 0\nrules: [{type: temporary, reason: R}]\n")
    with pytest.raises(ConfigError) as excinfo:
        load_rule_set([path])
    assert str(excinfo.value).splitlines() == [str(p) for p in excinfo.value.problems]
    assert len(excinfo.value.problems) == 2
    assert str(excinfo.value.problems[0]).startswith(f"{path}:")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: [d / "missing.yaml"], "cannot read file"),
        (lambda d: [d], "is a directory with no rule pack files (*.json, *.yaml, *.yml)"),
        (lambda d: [], "no rule pack files found"),
    ],
    ids=["missing-file", "empty-directory", "no-paths"],
)
def test_nothing_to_load(tmp_path: Path, make, message: str) -> None:
    found = problems(make(tmp_path))
    assert len(found) == 1 and message in found[0].message


# --------------------------------------------------------------------------------------------
# Finding the files: empty and unreadable directories, hidden entries, duplicate conditions

GOOD_PACK = "rules:\n  - {name: good/rule, type: temporary, reason: Good, pattern: 'good .*'}\n"


@pytest.fixture()
def plugins(tmp_path: Path) -> Path:
    """A plugins directory with one valid pack."""
    directory = tmp_path / "plugins"
    (directory / "good").mkdir(parents=True)
    write(directory / "good", "good.yaml", GOOD_PACK)
    return directory


def deny_listing(monkeypatch: pytest.MonkeyPatch, denied: Path) -> None:
    """Make listing ``denied`` fail with EACCES (the tests run as root, where chmod does not)."""
    real = packfile.list_directory

    def listing(path: Path) -> list[Path]:
        if path == denied:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path)

    monkeypatch.setattr(packfile, "list_directory", listing)


def test_empty_directory_given_as_a_rule_file_is_a_problem(plugins: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (problem,) = problems([plugins, empty])
    assert (problem.file, problem.field, problem.line) == (str(empty), "", None)
    assert problem.message == "is a directory with no rule pack files (*.json, *.yaml, *.yml)"


def test_plugins_directory_without_pack_files_is_a_problem(tmp_path: Path) -> None:
    directory = tmp_path / "plugins"
    (directory / "sub").mkdir(parents=True)
    write(directory, "README.md", "# notes, not a pack\n")
    (problem,) = problems([directory])
    assert (problem.file, problem.message) == (
        str(directory),
        "is a directory with no rule pack files (*.json, *.yaml, *.yml)",
    )


@pytest.mark.parametrize("where", ["top", "sub"])
def test_unreadable_plugins_directory_says_permission_denied(
    plugins: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    denied = plugins if where == "top" else plugins / "good"
    deny_listing(monkeypatch, denied)
    (problem,) = problems([plugins])
    assert (problem.file, problem.field) == (str(denied), "")
    assert problem.message == "cannot read directory: permission denied"


def test_hidden_entries_are_skipped(tmp_path: Path) -> None:
    """A mounted ConfigMap holds every file twice: as a symlink and in a hidden ..<timestamp> directory."""
    directory = tmp_path / "configmap"
    stamped = directory / "..2026_01_01_00_00_00.000000001"
    stamped.mkdir(parents=True)
    write(stamped, "mine.yaml", GOOD_PACK)
    (directory / "..data").symlink_to(stamped.name)
    (directory / "mine.yaml").symlink_to("..data/mine.yaml")
    write(directory, ".mine.yaml.swp", "not: [a pack")
    rule_set = load_rule_set([directory])
    assert rule_set.files == (str(directory / "mine.yaml"),)
    assert [r.name for r in rule_set.rules] == ["good/rule"]


def test_directory_symlink_loop_is_walked_once(plugins: Path) -> None:
    (plugins / "good" / "loop").symlink_to("..")
    assert load_rule_set([plugins]).files == (str(plugins / "good" / "good.yaml"),)


def test_duplicate_condition_type_names_both_entries(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "p.json",
        '{"conditions": [\n {"type": "C", "reason": "CIsFine"},\n {"type": "C", "reason": "CIsOk"}\n], "rules": []}',
    )
    (problem,) = problems([path])
    assert (problem.field, problem.line) == ("conditions[1].type", 3)
    assert problem.message == "duplicate condition type 'C' (also conditions[0].type, line 2)"


def test_a_later_file_may_still_redefine_a_condition(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", "conditions:\n  - {type: C, reason: CIsFine}\nrules: []\n")
    second = write(tmp_path, "b.yaml", "conditions:\n  - {type: C, reason: CIsGood}\nrules: []\n")
    assert [c.reason for c in load_rule_set([first, second]).conditions] == ["CIsGood"]


def test_problems_of_a_file_come_in_line_order(tmp_path: Path) -> None:
    """Shape problems and pattern problems are found in two passes but reported by line."""
    path = write(
        tmp_path,
        "p.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: '(?<=x)a'
            severity: loud
          - type: temporary
            reason: R
            pattern: 'b(?!c)'
        bufferSize: 0
        """,
    )
    assert [(p.field, p.line) for p in problems([path])] == [
        ("rules[0].pattern", 4),
        ("rules[0].severity", 5),
        ("rules[1].pattern", 8),
        ("bufferSize", 9),
    ]


def validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["validate-config", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_config_accepts_the_good_plugins(plugins: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = validate(capsys, "--plugins-dir", str(plugins))
    assert code == 0 and out.startswith("OK: 1 file(s), 1 rules")


def test_validate_config_rejects_an_empty_directory_given_as_a_file(
    plugins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = validate(capsys, "--plugins-dir", str(plugins), str(empty))
    assert (code, out) == (2, "")
    assert f"  {empty}: is a directory with no rule pack files (*.json, *.yaml, *.yml)" in err.splitlines()


def test_validate_config_rejects_a_plugins_directory_without_packs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = validate(capsys, "--plugins-dir", str(empty))
    assert code == 2
    assert f"{empty}: is a directory with no rule pack files" in err


def test_validate_config_reports_permission_denied(
    plugins: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deny_listing(monkeypatch, plugins)
    code, _, err = validate(capsys, "--plugins-dir", str(plugins))
    assert code == 2
    assert f"  {plugins}: cannot read directory: permission denied" in err.splitlines()
    assert "no rule pack files" not in err


def test_validate_config_reports_duplicate_condition_types(
    plugins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = write(
        tmp_path,
        "mine.yaml",
        """
        conditions:
          - {type: GpuHealth, reason: GpuIsHealthy, message: ok}
          - {type: GpuHealth, reason: GpuIsFine, message: ok}
        rules: []
        """,
    )
    code, _, err = validate(capsys, "--plugins-dir", str(plugins), str(mine))
    assert code == 2
    assert (
        f"  {mine}:3: conditions[1].type: duplicate condition type 'GpuHealth' (also conditions[0].type, line 2)"
        in err.splitlines()
    )


def test_validate_config_refuses_look_around_as_npd_would(
    plugins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = write(
        tmp_path,
        "mine.yaml",
        """
        rules:
          - type: temporary
            reason: R
            pattern: 'CE (?!memory read error).*'
        """,
    )
    code, _, err = validate(capsys, "--plugins-dir", str(plugins), str(mine))
    assert code == 2
    assert f"{mine}:4: rules[0].pattern: invalid regular expression" in err
    assert "look-around assertions are not supported: rule patterns are RE2/Go syntax" in err


def test_validate_config_accepts_hostile_but_valid_patterns(
    plugins: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """RE2 matches these in linear time, so they are fine (and NPD accepts them too)."""
    mine = write(
        tmp_path,
        "mine.yaml",
        """
        rules:
          - {type: temporary, reason: Nested, pattern: '(a+)+$'}
          - {type: temporary, reason: Overlap, pattern: '(x+x+)+y'}
          - {type: temporary, reason: Star, pattern: '(.*a){20}'}
        """,
    )
    code, out, err = validate(capsys, "--plugins-dir", str(plugins), str(mine))
    assert code == 0, err
    assert out.startswith("OK: 2 file(s), 4 rules")


# --------------------------------------------------------------------------------------------
# Valid packs


def test_minimal_npd_pack_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "mini.json", '{"rules": [{"type": "temporary", "reason": "Oops", "pattern": "oops"}]}')
    rule_set = load_rule_set([path])
    (rule,) = rule_set.rules
    assert (rule.name, rule.source, rule.type, rule.severity, rule.buffer_size) == (
        "mini:0",
        "mini",
        RuleType.TEMPORARY,
        Severity.WARNING,
        10,
    )
    assert (rule.condition, rule.suffix, rule.where, rule.threshold, rule.key_values) == (None, "", (), None, ())
    assert rule_set.files == (str(path),)


def test_permanent_rule_defaults_to_error_severity_and_may_use_a_condition_of_an_earlier_file(
    tmp_path: Path,
) -> None:
    conditions = write(tmp_path, "a.yaml", "conditions:\n  - {type: C, reason: CIsFine, message: ok}\nrules: []\n")
    rules = write(tmp_path, "b.yaml", "rules:\n  - {type: permanent, condition: C, reason: Bad, pattern: bad}\n")
    (rule,) = load_rule_set([conditions, rules]).rules
    assert (rule.type, rule.condition, rule.severity) == (RuleType.PERMANENT, "C", Severity.ERROR)


def test_directories_expand_recursively_in_sorted_order(tmp_path: Path) -> None:
    write(tmp_path, "b.yaml", "rules:\n  - {name: b, type: temporary, reason: B, pattern: bbbb}\n")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "a.json", '{"rules": [{"name": "a", "type": "temporary", "reason": "A", "pattern": "a"}]}')
    write(tmp_path, "a.yml", "rules:\n  - {name: c, type: temporary, reason: C, pattern: cccc}\n")
    write(tmp_path, "notes.txt", "not a pack")
    rule_set = load_rule_set([tmp_path])
    assert [Path(f).relative_to(tmp_path).as_posix() for f in rule_set.files] == ["a.yml", "b.yaml", "sub/a.json"]
    assert [r.name for r in rule_set.rules] == ["c", "b", "a"]


def test_own_npd_style_json_fixture() -> None:
    rule_set = load_rule_set([PACKS / "npd-style.json"])
    assert [(r.name, r.type, r.condition, r.reason) for r in rule_set.rules] == [
        ("fixture-npd:0", RuleType.TEMPORARY, None, "FixtureHung"),
        ("fixture-npd:1", RuleType.PERMANENT, "FixtureDeadlock", "FixtureDockerHung"),
    ]
    assert [(c.type, c.reason, c.message, c.clear_after) for c in rule_set.conditions] == [
        ("FixtureDeadlock", "FixtureHasNoDeadlock", "no deadlock", None)
    ]


def test_builtin_plugins_load() -> None:
    rule_set = load_rule_set([ROOT / "plugins"])
    names = [r.name for r in rule_set.rules]
    assert len(names) == len(set(names)) > 0
    assert {Path(f).parent.name for f in rule_set.files} >= {"kernel", "neuron", "nvidia"}
    declared = {c.type for c in rule_set.conditions}
    assert {r.condition for r in rule_set.rules if r.type is RuleType.PERMANENT} <= declared
    assert all(r.condition is None for r in rule_set.rules if r.type is RuleType.TEMPORARY)


@needs_testdata
def test_upstream_npd_kernel_monitor_json_loads_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "kernel-monitor.json"
    path.write_text(tool_output("npd-kernel-monitor.json"), encoding="utf-8")
    rule_set = load_rule_set([path])
    assert [(r.type.value, r.condition, r.reason, r.pattern) for r in rule_set.rules] == NPD_KERNEL_MONITOR
    assert [r.name for r in rule_set.rules] == [f"kernel-monitor:{i}" for i in range(len(NPD_KERNEL_MONITOR))]
    assert {(r.source, r.buffer_size) for r in rule_set.rules} == {("kernel-monitor", 10)}
    assert [(c.type, c.reason, c.message) for c in rule_set.conditions] == [
        ("KernelDeadlock", "KernelHasNoDeadlock", "kernel has no deadlock"),
        ("XfsShutdown", "XfsHasNotShutDown", "XFS has not shutdown"),
        ("CperHardwareErrorFatal", "CperHardwareHasNoFatalError", "UEFI CPER has no fatal error"),
    ]
    assert rule_set.reasons[:3] == ("OOMKilling", "TaskHung", "UnregisterNetDevice")


def _neuron_configmap_json() -> str:
    configmap = yaml.safe_load(tool_output("neuron-problem-detector-config.yml"))
    return configmap["data"]["kernel-monitor.json"]


@needs_testdata
def test_upstream_neuron_problem_detector_config_loads_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "kernel-monitor.json"
    path.write_text(_neuron_configmap_json(), encoding="utf-8")
    rule_set = load_rule_set([path])
    errors = ["SRAM_UNCORRECTABLE_ERROR", "NC_UNCORRECTABLE_ERROR", "HBM_UNCORRECTABLE_ERROR", "DMA_ERROR"]
    assert [(r.type, r.condition, r.reason, r.pattern) for r in rule_set.rules] == [
        (RuleType.PERMANENT, "NeuronHealth", f"NeuronHasError_{e}", f".* NEURON_HW_ERR={e} .*") for e in errors
    ]
    assert [(c.type, c.reason, c.message) for c in rule_set.conditions] == [
        ("NeuronHealth", "NeuronHasNoError", "Neuron has no error")
    ]
    json.loads(_neuron_configmap_json())  # the extracted document is plain JSON


@needs_testdata
def test_upstream_kernel_and_neuron_configs_load_side_by_side(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    kernel = tmp_path / "a" / "kernel-monitor.json"
    kernel.write_text(tool_output("npd-kernel-monitor.json"), encoding="utf-8")
    neuron = tmp_path / "b" / "kernel-monitor.json"
    neuron.write_text(_neuron_configmap_json(), encoding="utf-8")
    rule_set = load_rule_set([kernel, neuron])
    assert [r.reason for r in rule_set.rules] == [reason for _, _, reason, _ in NPD_KERNEL_MONITOR] + [
        f"NeuronHasError_{e}"
        for e in ["SRAM_UNCORRECTABLE_ERROR", "NC_UNCORRECTABLE_ERROR", "HBM_UNCORRECTABLE_ERROR", "DMA_ERROR"]
    ]
    assert len({r.name for r in rule_set.rules}) == len(rule_set.rules)
    assert [c.type for c in rule_set.conditions] == [
        "KernelDeadlock",
        "XfsShutdown",
        "CperHardwareErrorFatal",
        "NeuronHealth",
    ]


def test_unnamed_rules_of_packs_with_the_same_source_do_not_override(tmp_path: Path) -> None:
    first = write(
        tmp_path,
        "a.json",
        '{"source": "kernel-monitor", "rules": [{"type": "temporary", "reason": "A", "pattern": "aaaa"}]}',
    )
    second = write(
        tmp_path,
        "b.json",
        '{"source": "kernel-monitor", "rules": [{"type": "temporary", "reason": "B", "pattern": "bbbb"}]}',
    )
    assert [r.reason for r in load_rule_set([first, second]).rules] == ["A", "B"]


def test_explicit_name_may_target_a_default_name(tmp_path: Path) -> None:
    """Unnamed rules are called '<source>:<index>', so a later pack can still replace or disable them."""
    npd = write(
        tmp_path,
        "kernel-monitor.json",
        '{"source": "kernel-monitor", "rules": [{"type": "temporary", "reason": "A", "pattern": "aaaa"}, '
        '{"type": "temporary", "reason": "B", "pattern": "bbbb"}]}',
    )
    mine = write(
        tmp_path,
        "mine.yaml",
        """
        rules:
          - {name: 'kernel-monitor:0', type: temporary, reason: Replaced, pattern: cccc}
          - {name: 'kernel-monitor:1', enabled: false}
        """,
    )
    assert [(r.name, r.reason) for r in load_rule_set([npd, mine]).rules] == [("kernel-monitor:0", "Replaced")]


# --------------------------------------------------------------------------------------------
# Overrides: base.yaml then override.yaml


def test_later_pack_overrides_rules_lists_and_conditions() -> None:
    rule_set = load_rule_set([PACKS / "base.yaml", PACKS / "override.yaml"])
    rules = {r.name: r for r in rule_set.rules}
    # replaced in place, removed by enabled: false, new rules appended
    assert list(rules) == ["fixture/disk-error", "fixture/gpu-code", "fixture/gpu-kept", "fixture/last", "fixture/new"]
    disk = rules["fixture/disk-error"]
    assert (disk.reason, disk.severity, disk.pattern, disk.source, disk.file) == (
        "DiskFailure",
        Severity.CRITICAL,
        r"disk failure on (?P<dev>\w+)",
        "fixture-override",
        str(PACKS / "override.yaml"),
    )
    assert disk.buffer_size == 10  # the overriding file's bufferSize (default), not base.yaml's 5
    # a later list replaces the list for every rule that names it, whichever file the rule is in
    assert [(f.field, f.values, f.negate) for f in rules["fixture/gpu-code"].where] == [
        ("code", frozenset({"3"}), False)
    ]
    assert [(f.field, f.values) for f in rules["fixture/gpu-kept"].where] == [("code", frozenset({"7"}))]
    # a later condition of the same type replaces its defaults, keeping its place
    assert [(c.type, c.reason, c.message, c.clear_after, c.source) for c in rule_set.conditions] == [
        ("FixtureDisk", "FixtureDiskIsFine", "no disk error for 10 minutes", 600.0, "fixture-override"),
        ("FixtureGpu", "FixtureGpuIsHealthy", "GPU is healthy", None, "fixture-base"),
    ]
    assert rule_set.condition_spec("FixtureDisk").clear_after == 600.0
    assert rule_set.condition_spec("Nope") is None


OVERRIDE_MATCHES = [
    # (line, reasons found with base.yaml alone, reasons found with base.yaml + override.yaml)
    ("disk error on sda", ["DiskError"], []),
    ("disk failure on sda", [], ["DiskFailure"]),
    ("gpu code 1", ["GpuCode1"], []),
    ("gpu code 3", [], ["GpuCode3"]),
    ("gpu kept 7", ["GpuKept7"], ["GpuKept7"]),
    ("noisy neighbour", ["Noisy"], []),
    ("new rule 1", [], ["New"]),
    ("last line", ["Last"], ["Last"]),
]


@pytest.mark.parametrize(("line", "base", "overridden"), OVERRIDE_MATCHES, ids=[c[0] for c in OVERRIDE_MATCHES])
def test_overrides_change_what_matches(line: str, base: list[str], overridden: list[str]) -> None:
    alone = RuleEngine(rule_set=load_rule_set([PACKS / "base.yaml"]))
    both = RuleEngine(rule_set=load_rule_set([PACKS / "base.yaml", PACKS / "override.yaml"]))
    assert [f.reason for f in alone.feed([line])] == base
    assert [f.reason for f in both.feed([line])] == overridden


def test_order_of_packs_decides_which_rule_wins() -> None:
    rule_set = load_rule_set([PACKS / "override.yaml", PACKS / "base.yaml"])
    assert [r.name for r in rule_set.rules] == [
        "fixture/disk-error",
        "fixture/noisy",
        "fixture/new",
        "fixture/gpu-code",
        "fixture/gpu-kept",
        "fixture/last",
    ]
    assert rule_set.rules[0].reason == "DiskError"
    assert rule_set.condition_spec("FixtureDisk").reason == "FixtureDiskIsHealthy"


def test_disabled_rule_can_be_enabled_again_by_a_later_pack(tmp_path: Path) -> None:
    again = write(
        tmp_path,
        "again.yaml",
        """
        rules:
          - {name: fixture/noisy, type: temporary, reason: NoisyAgain, pattern: 'noisy .*'}
        """,
    )
    rule_set = load_rule_set([PACKS / "base.yaml", PACKS / "override.yaml", again])
    assert [r.name for r in rule_set.rules] == [
        "fixture/disk-error",
        "fixture/gpu-code",
        "fixture/gpu-kept",
        "fixture/noisy",
        "fixture/last",
        "fixture/new",
    ]
    assert [f.reason for f in RuleEngine(rule_set=rule_set).feed(["noisy neighbour"])] == ["NoisyAgain"]


def test_rule_can_be_disabled_by_name_alone() -> None:
    rule_set = load_rule_set([PACKS / "base.yaml", PACKS / "disable-by-name.yaml"])
    assert "fixture/noisy" not in [r.name for r in rule_set.rules]
