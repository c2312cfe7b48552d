"""The check plugin contract: what a check is, what it returns, what it may use.

A check is anything with a ``name``, an ``interval`` and a ``timeout`` (seconds), the condition
types it owns, and a ``run()`` returning results. Built-in checks (``plugins/<domain>/``),
third-party Python checks (entry-point group ``node_health_agent.checks``) and executables
(node-problem-detector's custom-plugin protocol) all look like this to the scheduler.

A factory builds a check from its configuration: ``factory(name=str, context=CheckContext,
options=dict)`` returns a :class:`Check` named ``name`` (a class whose constructor takes those
keyword arguments is a factory).
Bad options raise :class:`CheckConfigError` naming the option; the loader adds file and line.

Results never raise into the agent: a check that raises, hangs or returns garbage becomes
``UNKNOWN`` in the scheduler. A check reports the node's trouble as ``PROBLEM`` and the agent's own
trouble (a tool missing or timing out, a library that will not load) as ``UNKNOWN``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agent.core.process import ProcessResult
from agent.core.types import ConditionSpec, Severity

ENTRY_POINT_GROUP = "node_health_agent.checks"
# Reasons of an UNKNOWN that says the check itself cannot run (not that it could not tell this time):
LOAD_FAILED = "CheckLoadFailed"  # a Python plugin that cannot be imported or built (a BrokenCheck)
CANNOT_START = "CheckCannotStart"  # an executable that is missing, not executable, or that the kernel refuses
CANNOT_RUN_REASONS = frozenset({LOAD_FAILED, CANNOT_START})


class CheckStatus(enum.StrEnum):
    OK = "OK"
    PROBLEM = "PROBLEM"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True, kw_only=True, slots=True)
class Value:
    """One labelled number for metrics: exported as ``node_health_agent_check_<name>{check, <labels>}``.

    ``name`` is a metric name suffix (``[a-z_][a-z0-9_]*``), e.g. ``gpu_ecc_errors`` with labels
    ``{"gpu": "0", "type": "corrected", "counter": "volatile"}``.
    """

    name: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckResult:
    """One verdict of a check.

    ``condition`` is the node condition this verdict speaks for (``GpuEcc``); ``None`` makes it a
    warning: a ``PROBLEM`` becomes an Event (once, when it starts), never a condition. ``reason`` is
    a CamelCase word (``GpuEccBad``, ``NeuronDeviceMissing``); ``message`` says what was seen, in
    one line. ``severity`` matters for PROBLEMs: ``critical`` on an accelerator condition makes
    ``AcceleratedHardwareReady`` False.
    """

    status: CheckStatus
    condition: str | None
    reason: str
    message: str
    severity: Severity = Severity.ERROR
    values: tuple[Value, ...] = ()
    repeat_event: bool = False  # a warning's Event on every PROBLEM run, not only when it starts (NPD temporary)
    devices: tuple[str, ...] = ()


@runtime_checkable
class Check(Protocol):
    """What the scheduler runs. ``run`` is called from a worker thread, never twice at once."""

    @property
    def name(self) -> str: ...

    @property
    def interval(self) -> float | None: ...  # default seconds between runs (None: the agent's); config may override

    @property
    def timeout(self) -> float | None: ...  # default seconds a run may take (None: the agent's); config may override

    @property
    def conditions(self) -> Sequence[ConditionSpec]: ...  # the condition types it owns, healthy defaults

    def run(self) -> Sequence[CheckResult]: ...


@runtime_checkable
class Runnable(Protocol):
    """What the scheduler runs: a :class:`Check` as the agent holds it once loaded (a plugin's
    attributes read once, an executable, a broken plugin). What ``run`` returns is not trusted: the
    scheduler validates it at the seam."""

    @property
    def name(self) -> str: ...

    @property
    def conditions(self) -> Sequence[ConditionSpec]: ...

    def run(self) -> object: ...


class CheckConfigError(ValueError):
    """A factory's complaint about its options: ``field`` names the option (``expectedCount``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


RunProcess = Callable[..., ProcessResult]  # (argv, *, timeout, max_output=..., env=None) -> ProcessResult


def _no_labels() -> Mapping[str, str] | None:
    return None


def _no_instance_type() -> str | None:
    return None


@dataclass(frozen=True, kw_only=True)
class CheckContext:
    """What a check may use besides its options. Every path is a parameter so tests use fixture trees.

    - ``sys_root`` / ``dev_root``: the host's ``/sys`` and ``/dev`` (mounted read-only into the pod,
      e.g. at ``/host/sys``; a pod's own ``/dev`` shows only the devices given to it).
    - ``state_dir``: where a check may keep small files (e.g. the largest device count seen).
    - ``run_process``: runs a tool without a shell, with a timeout that kills its process group.
    - ``tool_path``: the ``PATH`` tools are looked up in.
    - ``node_labels``: the Node's labels when known (Kubernetes mode), else None.
    - ``instance_type``: the node's instance type when known (label, or configuration), else None.
    - ``clock``: wall-clock seconds (injected in tests).
    """

    sys_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    state_dir: Path = Path("/var/lib/node-health-agent")
    run_process: RunProcess | None = None
    tool_path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    node_labels: Callable[[], Mapping[str, str] | None] = _no_labels
    instance_type: Callable[[], str | None] = _no_instance_type
    clock: Callable[[], float] = time.time

    def run(self, argv: Sequence[str], *, timeout: float, max_output: int = 1 << 20) -> ProcessResult:
        """Run a tool (found in ``tool_path``) with the agent's process runner."""
        if self.run_process is None:
            from agent.core.process import run_process

            return run_process(argv, timeout=timeout, max_output=max_output, path=self.tool_path)
        return self.run_process(argv, timeout=timeout, max_output=max_output, path=self.tool_path)


@dataclass(frozen=True, kw_only=True)
class ScheduledCheck:
    """A check as configured: how often, how long, and how many verdicts in a row change a condition.

    ``failure_threshold`` consecutive PROBLEM results make a condition True; ``success_threshold``
    consecutive OK results make it False again; UNKNOWN changes nothing. ``group``/``group_limit``
    bound how many checks of one group run at once (an NPD plugin file's ``concurrency``), besides
    the scheduler's global limit. ``kind`` is ``python``, ``entry-point`` or ``executable``;
    ``origin`` says where it came from (file and field, or the entry point and its package).
    """

    check: Runnable
    interval: float
    timeout: float
    kind: str
    origin: str
    failure_threshold: int = 1
    success_threshold: int = 3
    jitter: float = 0.1  # each wait is interval * (1 ± jitter)
    group: str | None = None
    group_limit: int | None = None

    @property
    def name(self) -> str:
        return self.check.name


Factory = Callable[..., Check]  # factory(*, name: str, context: CheckContext, options: Mapping[str, Any]) -> Check
Options = Mapping[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckReport:
    """One finished (or abandoned) run of a check, as the scheduler hands it to the main loop."""

    check: str
    results: tuple[CheckResult, ...]
    finished_at: float  # wall-clock seconds
    duration: float
    failure_threshold: int = 1
    success_threshold: int = 3
