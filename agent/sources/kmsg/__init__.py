"""The kernel log (``/dev/kmsg``) source: read, decode, account.

- :mod:`~agent.sources.kmsg.reader`: the reader (I/O only; a chunk of raw records at a time).
- :mod:`~agent.sources.kmsg.decoder`: the one decoder, a chunk into records, by its :class:`Mode`.
- :mod:`~agent.sources.kmsg.format`: one record's format, the reference the decoder is tested against.
- :mod:`~agent.sources.kmsg.columns`: the decoder's lazy columns.
- :mod:`~agent.sources.kmsg.sequence`: skipped and lost records by sequence number.
- :mod:`~agent.sources.kmsg.stats`, :mod:`~agent.sources.kmsg.boot`: counters; the boot clock and id.

The relay (``relay_server``, ``relay_client``, ``relay_protocol``) carries these records over a socket.
"""
