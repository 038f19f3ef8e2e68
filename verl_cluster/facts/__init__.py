from verl_cluster.facts.model import GpuInfo, GpuPair, Interface, NodeFacts  # noqa: F401
