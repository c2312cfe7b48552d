"""The vocabulary and the kernel no feature owns: types, errors, durations, time formats, backoff,
the inbox/feed bus, the supervisor, node state and the state directory, the configuration-document
reader, the process runner, the RE2 wrapper."""
