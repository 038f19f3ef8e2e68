"""verl-cluster: start, check, plan and launch multi-node verl runs on Ray."""

__version__ = "0.1.0"
