"""Idle wakeups per thread: where an idle agent's CPU goes (issue 16).

Usage (from the checkout, with the package installed)::

    python bench/wakeups.py [--window 35] [--packs PACKS]

Runs a standalone agent in this process (every built-in pack and check unless ``--packs`` says
otherwise, a kmsg file that stays quiet, the real /sys of this machine), waits until every check has
run once, then counts each thread's context switches (voluntary + involuntary, from
``/proc/self/task/<tid>/status``) over ``--window`` seconds. An idle thread's CPU is its wakeups, and
unlike CPU % a count of context switches does not depend on what else the machine runs. Then it sends
itself SIGTERM and reports how long the agent took to stop.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _switches(tid: int) -> int:
    """Voluntary + involuntary context switches of one thread of this process so far (0 once it ended)."""
    try:
        text = Path(f"/proc/self/task/{tid}/status").read_text()
    except OSError:
        return 0
    return sum(int(line.split()[1]) for line in text.splitlines() if "ctxt_switches:" in line)


def _cpu_seconds() -> float:
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _first_round_done(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return False
    prefix = "node_health_agent_check_last_success_timestamp_seconds{"
    stamps = [line for line in text.splitlines() if line.startswith(prefix)]
    if "node_health_agent_check_runs_total" not in text:
        return "node_health_agent_config_generation" in text  # no checks: up is enough
    return bool(stamps) and all(float(line.split()[-1]) > 0 for line in stamps)


def _names(*, skip: frozenset[int] = frozenset()) -> dict[int, str]:
    """tid -> thread name (threads of the same name numbered: check-worker, check-worker#2, ...), but
    not the threads in ``skip`` (the test API server's)."""
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for thread in sorted(threading.enumerate(), key=lambda t: t.native_id or 0):
        if thread.native_id is None or thread.native_id in skip:
            continue
        if getattr(getattr(thread, "_target", None), "__qualname__", "") == "ThreadingMixIn.process_request_thread":
            continue  # the test API server answering a request: not the agent
        name = thread.name
        target = getattr(thread, "_target", None)  # a thread left with its default name: say what it runs
        if name.startswith("Thread-"):
            what = getattr(target, "__qualname__", None) or f"{type(thread).__module__}.{type(thread).__qualname__}"
            name = f"{name} ({what})"
        seen[name] += 1
        out[thread.native_id] = name if seen[name] == 1 else f"{name}#{seen[name]}"
    return out


def measure(*, window: float, port: int, result: dict[str, object], skip: frozenset[int]) -> None:
    """In a thread of its own: wait for the agent, count, then SIGTERM this process."""
    try:
        deadline = time.monotonic() + 120
        while not _first_round_done(port):
            if time.monotonic() > deadline:
                raise TimeoutError("the agent did not finish its first round of checks in 120 s")
            time.sleep(0.5)
        time.sleep(3.0)  # startup work (imports, first runs) over before counting
        me = threading.get_native_id()
        names = _names(skip=skip)
        before = {tid: _switches(tid) for tid in names}
        cpu0, t0 = _cpu_seconds(), time.monotonic()
        time.sleep(window)
        cpu1, t1 = _cpu_seconds(), time.monotonic()
        after = {tid: _switches(tid) for tid in names}
        elapsed = t1 - t0
        rows = sorted(
            ((names[tid], (after[tid] - before[tid]) / elapsed) for tid in names if tid != me),
            key=lambda row: (-row[1], row[0]),
        )
        result["rows"] = rows
        result["elapsed"] = elapsed
        result["cpu_percent"] = 100.0 * (cpu1 - cpu0) / elapsed
        result["threads"] = len(names) - 1
    except BaseException as exc:  # reported by the main thread
        result["error"] = exc
    finally:
        result["stop_sent"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    from agent.app.cli import main as agent_main
    from agent.app.settings import builtin_packs

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=35.0, help="seconds to count over (default 35)")
    parser.add_argument("--packs", default=",".join(builtin_packs()), help="packs (default: every built-in)")
    parser.add_argument(
        "--kmsg-path",
        help="the kernel log to follow (default: /dev/kmsg where readable, as deployed; else a quiet file, "
        "which the reader must poll at its end once a second)",
    )
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="Kubernetes mode against the test API server (tests/kubeapi) in this process; its threads are not counted",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmpdir, socket.socket() as s:
        tmp = Path(tmpdir)
        mode = ["--standalone"]
        server = None
        ours = {t.native_id for t in threading.enumerate()}
        if args.kubernetes:
            from bench.run import _kube_setup

            server, client = _kube_setup(tmp)
            client.close()
            mode = ["--kubeconfig", str(tmp / "kubeconfig"), "--node-name", "bench-node"]
        skip = frozenset(t.native_id for t in threading.enumerate() if t.native_id not in ours and t.native_id)
        kmsg = args.kmsg_path or ("/dev/kmsg" if os.access("/dev/kmsg", os.R_OK) else None)
        if kmsg is None:
            kmsg = str(tmp / "kmsg")
            Path(kmsg).write_text("6,1,1000,-;hello\n")
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        result: dict[str, object] = {}
        threading.Thread(
            target=measure,
            kwargs={"window": args.window, "port": port, "result": result, "skip": skip},
            name="bench-measure",
            daemon=True,
        ).start()
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # the stdout sink's lines
            code = agent_main(
                ["run", *mode, "--pack", args.packs, "--kmsg-path", str(kmsg)]
                + ["--state-dir", str(tmp / "state"), "--listen", f"127.0.0.1:{port}", "--log-level", "warning"]
            )
        stopped = time.monotonic()
        if server is not None:
            server.stop()
    if "error" in result:
        print(f"measurement failed: {result['error']!r}", file=sys.stderr)
        return 1
    rows = result["rows"]
    assert isinstance(rows, list)
    print(f"{'Kubernetes mode (test API server)' if args.kubernetes else 'standalone'}; kernel log: {kmsg}")
    print(f"{'thread':28} wakeups/s   (over {result['elapsed']:.1f} s)")
    for name, rate in rows:
        print(f"{name:28} {rate:8.2f}")
    total = sum(rate for _, rate in rows)
    print(f"{'all (' + str(result['threads']) + ' threads)':28} {total:8.2f}")
    print(f"process CPU: {result['cpu_percent']:.3f} % of a core (10 ms ticks: coarse; indicative only)")
    sent = result["stop_sent"]
    assert isinstance(sent, float)
    print(f"SIGTERM -> agent returned {code} in {stopped - sent:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
