"""Multi-host test harness: Linux network namespaces as hosts, each with its own PID namespace, private
/tmp and /root, and optionally a real OpenSSH server. See netns.py."""

from tests.harness.netns import Host, NetnsLab, integration_ready  # noqa: F401
