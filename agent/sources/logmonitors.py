"""node-problem-detector ``system-log-monitor`` files with ``plugin: filelog`` or ``journald``.

Each such file is a monitor: where to read (``logPath`` and ``pluginConfig``), its own rules and
conditions (compiled like any rule pack), and a producer component ``log:<source>`` that feeds its
records to the main loop, which matches them with that monitor's rules only. Settings are checked
at load time; every problem names the file, the field and the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.core.configdoc import Problems, windows_path_problem
from agent.core.configfiles import ConfigFile, Kind
from agent.core.durations import parse_duration
from agent.sources.filelog import FileLogConfig, FileLogConfigError, compile_line_parser
from agent.sources.journald import JournalConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class MonitorSettings:
    name: str  # "log:<source>", the component name and the key of its rules in the main loop
    source: FileLogConfig | JournalConfig


def monitor_settings(file: ConfigFile, col: Problems, *, taken: set[str]) -> MonitorSettings | None:
    """Where and how a filelog/journald monitor reads; None (with problems in ``col``) if it cannot."""
    data = file.doc.data
    before = len(col)
    plugin_config = data.get("pluginConfig", {})
    if not isinstance(plugin_config, dict):
        col.add(("pluginConfig",), "must be a mapping")
        plugin_config = {}
    lookback = 0.0
    if "lookback" in data:
        try:
            lookback = parse_duration(data["lookback"])
        except ValueError:
            lookback = 0.0  # the rule-pack schema reports it
    base = str(data.get("source") or file.path.stem)
    name = f"log:{base}"
    n = 2
    while name in taken:
        name, n = f"log:{base}-{n}", n + 1
    taken.add(name)
    source: FileLogConfig | JournalConfig
    if file.kind is Kind.LOG_FILE:
        path = data.get("logPath")
        if (windows := windows_path_problem(path)) is not None:
            col.add(("logPath",), windows)
        elif not isinstance(path, str) or not path.startswith("/"):
            col.add(("logPath",), f"required for plugin filelog: the absolute path of the log file, got {path!r}")
        skip = data.get("skipList", [])
        if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
            col.add(("skipList",), "must be a list of strings")
            skip = []
        texts = {}
        for key in ("timestamp", "message", "timestampFormat"):
            value = plugin_config.get(key)
            if not isinstance(value, str) or not value:
                col.add(("pluginConfig", key), "required for plugin filelog: a non-empty string")
            texts[key] = value if isinstance(value, str) else ""
        source = FileLogConfig(
            path=path if isinstance(path, str) else "",
            timestamp_regex=texts["timestamp"],
            message_regex=texts["message"],
            timestamp_format=texts["timestampFormat"],
            lookback=lookback,
            skip_list=tuple(skip),
        )
        if len(col) == before:
            try:
                compile_line_parser(source)
            except FileLogConfigError as exc:
                col.add(tuple(exc.field.split(".")), exc.message)
    else:
        ident = plugin_config.get("source")
        if not isinstance(ident, str) or not ident.strip():
            col.add(
                ("pluginConfig", "source"),
                "required for plugin journald: the SYSLOG_IDENTIFIER to follow (e.g. 'kernel', 'dockerd')",
            )
            ident = ""
        directory: Any = data.get("logPath")
        if (windows := windows_path_problem(directory)) is not None:
            col.add(("logPath",), windows)
        elif directory is not None and (not isinstance(directory, str) or not directory.startswith("/")):
            col.add(("logPath",), f"must be the absolute path of a journal directory, got {directory!r}")
            directory = None
        source = JournalConfig(source=ident, directory=directory or None, lookback=lookback)
    return MonitorSettings(name=name, source=source) if len(col) == before else None


def build_source(settings: MonitorSettings) -> Any:
    """The producer's Source for one monitor."""
    if isinstance(settings.source, FileLogConfig):
        from agent.sources.filelog import FileLogSource

        return FileLogSource(config=settings.source)
    from agent.sources.journald import JournalSource

    return JournalSource(config=settings.source)
