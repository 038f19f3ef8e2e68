"""The node agent: our Ray on one node (probe, stop exactly ours, start, GCS queries) through the node-side script,
and the cluster token every node and client authenticates with. Diagnostics, lifecycle and watch all talk to nodes
through `agent.Node` / `cluster_nodes` / `run_on_nodes`."""
