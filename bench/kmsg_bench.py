"""Kernel log reader throughput: ``KmsgReader.batches`` against a bare read-and-split loop.

Both read the same kmsg-format regular file (``follow=False``); the bare loop only splits each record's
header, so the gap between the two figures is what parsing into ``LogRecord``s and sequence accounting
cost. Run ``python bench/kmsg_bench.py`` to print both figures for a 1,000,000-record file.
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from agent.sources.kmsg.reader import KmsgReader
from agent.sources.kmsg.stats import KmsgStats

# (weight, priority): mostly kernel info, some notice/warning/debug, a few userspace (facility 1) writes.
_PRIORITIES = ((70, 6), (10, 5), (8, 4), (5, 7), (4, 12), (3, 14))
_DICTIONARY_RATE = 0.002  # records with dictionary lines (device events)
_CALLER_RATE = 0.3  # records with a caller id field (CONFIG_PRINTK_CALLER)
_CONTINUATION_RATE = 0.005


def _escape(text: str) -> bytes:
    """Escape like the kernel: control bytes, bytes >= 0x7f and the backslash become \\xNN."""
    raw = text.encode()
    if text.isascii() and text.isprintable() and "\\" not in text:
        return raw
    return b"".join(bytes([c]) if 32 <= c < 127 and c != 0x5C else b"\\x%02x" % c for c in raw)


def write_kmsg_file(path: str | Path, n: int, *, fault_rate: float = 0.01, seed: int = 0) -> None:
    """Write ``n`` realistic records to ``path``: increasing seq and usec, a few dictionary lines."""
    from bench.corpus import kernel_lines

    rng = random.Random(seed)
    weights, priorities = zip(*_PRIORITIES, strict=True)
    seq, usec = rng.randint(1000, 5000), rng.randint(5_000_000, 50_000_000)
    with open(path, "wb") as out:
        parts: list[bytes] = []
        for i, message in enumerate(kernel_lines(n, fault_rate=fault_rate, seed=seed)):
            prio = 3 if message.startswith(("NVRM: Xid", "NEURON_HW_ERR")) else rng.choices(priorities, weights)[0]
            flags = "c" if rng.random() < _CONTINUATION_RATE else "-"
            caller = f",caller=T{rng.randint(1, 99999)}" if rng.random() < _CALLER_RATE else ""
            parts.append(f"{prio},{seq + i},{usec},{flags}{caller};".encode() + _escape(message) + b"\n")
            if rng.random() < _DICTIONARY_RATE:
                parts.append(b" SUBSYSTEM=pci\n DEVICE=+pci:0000:%02x:00.0\n" % rng.getrandbits(8))
            usec += rng.randint(1, 2000)
            if len(parts) >= 10_000:
                out.write(b"".join(parts))
                parts.clear()
        out.write(b"".join(parts))


def bare_read_per_s(path: str | Path, *, repeat: int = 3) -> float:
    """Records/s of the plain bare loop: iterate the file's lines, split each record's header (best of ``repeat``).

    ``for line in file``, ``partition(b";")`` and ``split(b",")``: what a Python program that reads
    the file and splits each header does, with nothing else (no numbers, no text decoding).
    """

    def once() -> tuple[float, int]:
        count = 0
        start = time.perf_counter()
        with open(path, "rb") as f:
            for line in f:
                if line[:1] != b" ":
                    prefix, _, _message = line.partition(b";")
                    prefix.split(b",")
                    count += 1
        return time.perf_counter() - start, count

    return _best(once, repeat)


def bare_parse_per_s(path: str | Path, *, repeat: int = 3) -> float:
    """Records/s of the bare loop that also turns each header into numbers and the text into str.

    The least any reader must do per record; shown beside :func:`bare_read_per_s` (no target).
    """

    def once() -> tuple[float, int]:
        count = 0
        start = time.perf_counter()
        with open(path, "rb") as f:
            for line in f:
                if line[:1] != b" ":
                    prefix, _, message = line.partition(b";")
                    prio, seq, usec, _flags = prefix.split(b",", 3)
                    int(prio), int(seq), int(usec), message.decode()
                    count += 1
        return time.perf_counter() - start, count

    return _best(once, repeat)


def reader_per_s(path: str | Path, *, repeat: int = 3) -> float:
    """Records/s of ``KmsgReader.batches`` reading the file to its end (best of ``repeat``)."""

    def once() -> tuple[float, int]:
        stats = KmsgStats()
        reader = KmsgReader(path=path, stats=stats, follow=False)
        count = 0
        start = time.perf_counter()
        for batch in reader.batches(stop=threading.Event()):
            count += len(batch)
        elapsed = time.perf_counter() - start
        if stats.parse_errors or stats.records_lost:
            raise SystemExit(f"kmsg bench: {stats.parse_errors} parse errors, {stats.records_lost} records lost")
        return elapsed, count

    return _best(once, repeat)


def _best(once, repeat: int) -> float:
    runs = [once() for _ in range(repeat)]
    counts = {count for _, count in runs}
    if len(counts) != 1:
        raise SystemExit(f"kmsg bench: runs disagree on the record count: {sorted(counts)}")
    return counts.pop() / min(seconds for seconds, _ in runs)


def main(n: int = 1_000_000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.kmsg"
        write_kmsg_file(path, n)
        print(f"kmsg file: {n} records, {path.stat().st_size / 2**20:.1f} MiB")
        print(f"bare read+split: {bare_read_per_s(path):12,.0f} records/s")
        print(f"KmsgReader:      {reader_per_s(path):12,.0f} records/s (target >= 500,000)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
