"""RDMA / InfiniBand / EFA built-in checks: port state, rate and error counters read from sysfs."""
