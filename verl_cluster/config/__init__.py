from verl_cluster.config.cluster import ClusterSpec, HeadSpec, NodeSpec, load_cluster  # noqa: F401
