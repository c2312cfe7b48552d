"""Recovery: decide (a pure policy function) and act (cordon, drain, Auto Scaling health) under a budget."""
