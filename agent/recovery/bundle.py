"""The diagnostics bundle: evidence kept before a reboot or a replace (issue 15).

Before a remedy that ends this host's state (EC2 reboot, Auto Scaling replace), the recovery loop
calls :meth:`DiagnosticsBundle.before_remedy` once per incident and remedy. It collects

- the kernel log lines the agent read this boot (the main loop's bounded ring, newest kept),
- the latest result of every check (status, message, values, duration) and our conditions,
- one ``nvidia-smi -q`` and one ``neuron-ls`` when the tool is on the tool path (each with a timeout,
  through the agent's process runner; output cut at 1 MiB),
- the incident and a summary of the agent's configuration,

into one gzip-compressed JSON document of at most :data:`MAX_BYTES` before compression (the kernel
log and tool outputs are cut, oldest lines first, to fit), and writes it

- to ``<state dir>/diagnostics/<sequence>-<time>-<reason>-<remedy>.json.gz`` (mode 0600, atomically;
  the ``keep`` written last kept, by the sequence number, never by the time in the name, and never the
  one the current incident names), which survives the reboot, and
- when configured, to S3 (``s3://bucket/prefix/<node>/<file>``; ``s3:PutObject`` under that prefix only).

Its locations are added to the incident (``evidence``). It never delays the remedy by more than
``deadline`` seconds (30): the collection runs in a thread of its own and the remedy goes on when the
deadline passes, whatever is still running (a hung tool is killed at its own timeout). Whatever goes
wrong (a full disk, an unwritable directory, S3 refusing) is reported in the result and in the
bundle's ``problems``, never raised: evidence must not stand in the way of the remedy.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.process import ProcessResult, run_process
from agent.core.statedir import atomic_write, condition_to_json
from agent.core.timefmt import iso
from agent.core.types import Snapshot
from agent.recovery.model import Action, Incident

log = logging.getLogger(__name__)

DIRECTORY = "diagnostics"  # under the state directory
DEADLINE = 30.0  # seconds the remedy may wait for the bundle, at most
TOOL_TIMEOUT = 10.0  # seconds one tool may run
TOOL_OUTPUT = 1 << 20  # bytes of one tool's output kept
MAX_BYTES = 4 << 20  # the bundle's JSON before compression
KEEP = 5
TOOLS: tuple[tuple[str, ...], ...] = (("nvidia-smi", "-q"), ("neuron-ls",))
# The remedies a bundle is taken before (by value: a reboot remedy may or may not exist in this version).
REMEDIES = frozenset(a for a in Action if a.value in ("reboot", "mark-unhealthy"))
_S3_URL = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?$")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_SEQUENCE = re.compile(r"^(\d{1,30})-\d{8}T\d{6}Z-")  # <sequence>-<time>-<reason>-<remedy>.json.gz

RunProcess = Callable[..., ProcessResult]


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without slashes at either end); ValueError saying why not."""
    match = _S3_URL.match(url.strip())
    if match is None:
        raise ValueError(
            f"{url!r} is not s3://BUCKET/PREFIX (a bucket name of 3-63 lowercase letters, digits, '.', '-')"
        )
    bucket, prefix = match.group(1), (match.group(2) or "").strip("/")
    if ".." in bucket or any(part in ("", ".", "..") for part in prefix.split("/") if prefix):
        raise ValueError(f"{url!r}: empty, '.' or '..' parts are not allowed in the bucket or prefix")
    if len(prefix) > 512:
        raise ValueError(f"{url!r}: the prefix is longer than 512 characters")
    return bucket, prefix


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleResult:
    """Where the bundle went (``path`` / ``s3`` empty when not written there) and what went wrong."""

    path: str = ""
    s3: str = ""
    problems: tuple[str, ...] = ()
    seconds: float = 0.0
    size: int = 0  # bytes of JSON before compression

    @property
    def locations(self) -> tuple[str, ...]:
        return tuple(x for x in (self.path, self.s3) if x)


class DiagnosticsBundle:
    """``before_remedy(action, incident) -> incident`` (with the bundle's locations in ``evidence``).

    Every input is a callable read when a bundle is made: ``kernel_log`` (lines), ``checks`` (name ->
    a JSON-able description of its latest result), ``snapshot`` (our conditions), ``configuration``
    (a JSON-able summary). ``s3_put(key, body)`` puts one object (``agent.adapters.aws.S3Uploader``);
    None = no S3."""

    def __init__(
        self,
        *,
        state_dir: Path,
        node_name: str,
        kernel_log: Callable[[], Sequence[str]] = list,
        checks: Callable[[], Mapping[str, Any]] = dict,
        snapshot: Callable[[], Snapshot] | None = None,
        configuration: Callable[[], Mapping[str, Any]] = dict,
        run_process: RunProcess | None = None,
        tool_path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        tools: Sequence[Sequence[str]] = TOOLS,
        s3_url: str = "",
        s3_put: Callable[[str, bytes], None] | None = None,
        keep: int = KEEP,
        deadline: float = DEADLINE,
        tool_timeout: float = TOOL_TIMEOUT,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dir = state_dir / DIRECTORY
        self._node = node_name
        self._kernel_log = kernel_log
        self._checks = checks
        self._snapshot = snapshot
        self._configuration = configuration
        self._run_process = run_process
        self._tool_path = tool_path
        self._tools = tuple(tuple(t) for t in tools)
        self._s3 = parse_s3_url(s3_url) if s3_url and s3_put is not None else None
        self._s3_put = s3_put
        self._keep = keep
        self._deadline = deadline
        self._tool_timeout = tool_timeout
        self._max_bytes = max_bytes
        self._clock = clock
        self._monotonic = monotonic
        self._taken: dict[tuple[str, str], BundleResult] = {}  # (incident id, remedy) -> its bundle
        self.written = 0
        self.failures = 0
        self.last: BundleResult | None = None

    # ---- the loop's call ---------------------------------------------------------------------------

    def before_remedy(self, action: Action, incident: Incident) -> Incident:
        """Take the bundle for ``incident`` before ``action`` (once per incident and remedy; a retried
        remedy reuses it) and return the incident with its locations added. Waits ``deadline`` at most."""
        if action not in REMEDIES or (self._keep <= 0 and self._s3 is None):
            return incident
        try:
            key = (incident.id, action.value)
            result = self._taken.get(key)
            if result is None:
                result = self.collect(action=action, incident=incident)
                self._taken[key] = result
                while len(self._taken) > 64:  # one per remedy; bounded all the same
                    del self._taken[next(iter(self._taken))]
            found = tuple(x for x in result.locations if x not in incident.evidence)
        except Exception:  # a bug here must never hold the remedy
            self.failures += 1
            log.exception("diagnostics bundle for %s failed; the remedy goes on without it", incident.id)
            return incident
        return dataclasses.replace(incident, evidence=(*incident.evidence, *found)[-8:]) if found else incident

    def collect(self, *, action: Action, incident: Incident) -> BundleResult:
        """Make, write and upload one bundle in a thread of its own; wait for it ``deadline`` at most."""
        started = self._monotonic()
        box: list[BundleResult] = []

        def make() -> None:
            try:
                box.append(self._make(action=action, incident=incident, started=started))
            except Exception as exc:  # a bug: reported like any trouble, never raised into the remedy
                log.exception("diagnostics bundle for %s failed", incident.id)
                box.append(BundleResult(problems=(f"the bundle failed: {type(exc).__name__}: {exc}",)))

        worker = threading.Thread(
            target=make,
            name="diagnostics-bundle",
            daemon=True,  # a tool or a write that hangs past the deadline must not hold the agent's exit
        )
        worker.start()
        worker.join(self._deadline)
        if box:
            result = box[0]
        else:
            result = BundleResult(
                problems=(f"the bundle took longer than {self._deadline:g}s: the remedy goes on without it",),
                seconds=self._monotonic() - started,
            )
        if result.problems:
            self.failures += 1
            log.warning("diagnostics bundle for %s: %s", incident.id, "; ".join(result.problems))
        if result.path or result.s3:
            self.written += 1
            log.info("diagnostics bundle for %s: %s", incident.id, ", ".join(result.locations))
        self.last = result
        return result

    # ---- making one ----------------------------------------------------------------------------------

    def _make(self, *, action: Action, incident: Incident, started: float) -> BundleResult:
        problems: list[str] = []
        now = self._clock()
        doc: dict[str, Any] = {
            "kind": "node-health-agent diagnostics bundle",
            "version": 1,
            "node": self._node,
            "createdAt": iso(now),
            "remedy": action.value,
            "incident": incident.to_json(),
        }
        doc["kernelLog"] = self._section("kernel log", lambda: [str(x) for x in self._kernel_log()], problems)
        doc["checks"] = self._section("check results", lambda: dict(self._checks()), problems)
        if self._snapshot is not None:
            snapshot = self._snapshot

            doc["conditions"] = self._section(
                "conditions", lambda: [condition_to_json(c) for c in snapshot().conditions], problems
            )
        doc["configuration"] = self._section("configuration", lambda: dict(self._configuration()), problems)
        doc["tools"] = {" ".join(argv): self._tool(argv, started=started) for argv in self._tools}
        doc["problems"] = problems  # filled in further below, before the bundle is encoded
        body, size, cut = self._fit(doc)
        if cut:
            problems.append(f"cut to fit {self._max_bytes} bytes: {', '.join(cut)}")
            body, size, _ = self._fit(doc)
        data = gzip.compress(body, compresslevel=6, mtime=0)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        name = f"{stamp}-{_SAFE.sub('_', incident.reason)[:60]}-{action.value}.json.gz"
        path = ""
        if self._keep > 0:
            name = f"{self._next_sequence():06d}-{name}"  # the same name in S3
            target = self._dir / name
            try:
                atomic_write(target, data)  # a temporary file of mode 0600, renamed
                target.chmod(0o600)
                path = str(target)
                self._prune(keep_also={target.name, *(Path(e).name for e in incident.evidence)})
            except OSError as exc:
                problems.append(f"cannot write {target}: {exc.strerror or exc}")
        s3 = ""
        if self._s3 is not None and self._s3_put is not None:
            bucket, prefix = self._s3
            key = "/".join(p for p in (prefix, _SAFE.sub("_", self._node)[:200], name) if p)
            try:
                self._s3_put(key, data)
                s3 = f"s3://{bucket}/{key}"
            except Exception as exc:  # AwsError (denied, throttled, unreachable) or a bug: reported, never raised
                problems.append(f"cannot put s3://{bucket}/{key}: {exc}")
        return BundleResult(path=path, s3=s3, problems=tuple(problems), seconds=self._monotonic() - started, size=size)

    def _section(self, what: str, read: Callable[[], Any], problems: list[str]) -> Any:
        try:
            value = read()
            json.dumps(value, default=str)  # what cannot be encoded is reported, not carried into the bundle
            return value
        except Exception as exc:  # a bug reading one part must not lose the others
            problems.append(f"cannot read the {what}: {type(exc).__name__}: {exc}")
            return None

    def _tool(self, argv: tuple[str, ...], *, started: float) -> dict[str, Any]:
        if shutil.which(argv[0], path=self._tool_path) is None:
            return {"present": False}
        left = self._deadline - (self._monotonic() - started) - 2.0  # room to write and upload
        if left < 1.0:
            return {"present": True, "error": "skipped: no time left before the remedy"}
        run = self._run_process or run_process  # the agent's runner unless one is injected
        result = run(list(argv), timeout=min(self._tool_timeout, left), max_output=TOOL_OUTPUT, path=self._tool_path)
        return {
            "present": True,
            "exitCode": result.exit_code,
            "timedOut": result.timed_out,
            "error": result.error,
            "seconds": round(result.duration, 3),
            "stdout": result.stdout,
            "stdoutTruncated": result.stdout_truncated,
            "stderr": result.stderr[-65536:],
        }

    def _fit(self, doc: dict[str, Any]) -> tuple[bytes, int, list[str]]:
        """The JSON of ``doc``, its kernel log and tool outputs cut (oldest lines first) until it fits."""
        cut: list[str] = []
        for _ in range(40):
            body = json.dumps(doc, default=str, ensure_ascii=False).encode("utf-8", "replace")
            if len(body) <= self._max_bytes:
                return body, len(body), cut
            lines = doc.get("kernelLog")
            tools = [t for t in doc["tools"].values() if len(t.get("stdout") or "") > 1024]
            if isinstance(lines, list) and len(lines) > 16:
                doc["kernelLog"] = lines[len(lines) // 2 :]
                _note(cut, "kernel log (oldest lines)")
            elif tools:
                for t in tools:
                    t["stdout"] = t["stdout"][: len(t["stdout"]) // 2]
                    t["stdoutTruncated"] = True
                _note(cut, "tool output")
            else:
                for section in ("checks", "conditions", "configuration", "kernelLog"):
                    if doc.get(section):
                        doc[section] = None
                        _note(cut, section)
                        break
                else:
                    break
        body = json.dumps({k: doc[k] for k in ("kind", "version", "node", "createdAt", "remedy")}).encode()
        return body, len(body), [*cut, "everything but the header"]

    def _written_order(self) -> list[tuple[int, float, str, Path]]:
        """The bundles in the order they were written, oldest first: by the sequence number that starts
        our names; a name without one (an older version's, or a stray file) counts as older than any
        numbered one, by modification time among them. Never by the time in the name: a clock that once
        ran ahead would make its bundles the "newest" for years."""
        found = []
        for path in self._dir.glob("*.json.gz"):
            if not path.is_file():
                continue
            match = _SEQUENCE.match(path.name)
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            found.append((int(match.group(1)) if match else -1, mtime, path.name, path))
        return sorted(found)

    def _next_sequence(self) -> int:
        """One more than the highest sequence number in the directory (1 in an empty one)."""
        try:
            return max((seq for seq, _, _, _ in self._written_order() if seq > 0), default=0) + 1
        except OSError:  # an unreadable directory: the write says why
            return 1

    def _prune(self, *, keep_also: set[str]) -> None:
        """Keep the ``keep`` bundles written last, and always those named in ``keep_also`` (the one just
        written, and every one the current incident's evidence lists) whatever their number."""
        bundles = self._written_order()
        excess = len(bundles) - self._keep
        for _, _, name, path in bundles:
            if excess <= 0:
                break
            if name in keep_also:
                continue
            path.unlink(missing_ok=True)
            excess -= 1


def _note(cut: list[str], what: str) -> None:
    if what not in cut:
        cut.append(what)
