"""One module per command that is more than a few lines (``check``, ``status``)."""
