"""Built-in AWS Neuron checks: devices and ECC counters, allocation capacity, UltraServer labels."""
