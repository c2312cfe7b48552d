"""The main loop: the one writer of node state."""
