"""Periodic checks: the plugin contract (``model``), the process runner, the scheduler and the judge."""
