"""node-health-agent: per-node health agent for accelerator nodes."""

__version__ = "0.1.0"
