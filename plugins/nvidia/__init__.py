"""Built-in NVIDIA GPU checks: GPU count, ECC and memory repair, NVLink, PCIe width and thermal slowdown."""
