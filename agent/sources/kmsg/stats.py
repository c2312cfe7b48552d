"""The counters of a kernel log source (reader, relay client, log monitors)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KmsgStats:
    """Counters of one reader, read by the metrics sink and ``/healthz`` at scrape time.

    Thread-safety: the reader thread is the only writer. Each field is a plain value whose assignment
    is atomic under the GIL, so other threads may read single fields at any time; they must not expect
    two fields to be consistent with each other.
    """

    records_read: int = 0  # records delivered (new sequence numbers)
    records_lost: int = 0  # sum of sequence-number gaps, including ring-buffer overwrites (EPIPE)
    overruns: int = 0  # EPIPE reads: the kernel overwrote records before we read them
    reader_restarts: int = 0  # reopens after an error
    read_errors: int = 0  # OSErrors on open/read (other than EAGAIN/EPIPE)
    parse_errors: int = 0  # records skipped because their header could not be parsed (never also counted lost)
    malformed_lines: int = 0  # malformed dictionary lines dropped from records that were kept
    last_record_time: float | None = None  # wall-clock timestamp of the last delivered record
    # clock() (time.monotonic) when the open source last answered a read: data, EAGAIN, or end of file while
    # following (at least every idle_wait while idle). Never refreshed in backoff or by a failed open, nor
    # while the consumer holds on to a batch (a stalled pipeline goes stale).
    last_activity: float | None = None
    # Why the source cannot be read, e.g. "cannot open /dev/kmsg: [Errno 13] Permission denied"; None once
    # the open source answers.
    last_error: str | None = None
    connected: bool = False  # the source is open
