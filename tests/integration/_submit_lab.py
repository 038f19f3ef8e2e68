"""Lab helpers for the submit/torchrun integration tests."""

import subprocess

from tests.harness import NetnsLab


def clear_stale_links(lab: NetnsLab) -> None:
    """Remove veths left on this lab's subnet by an earlier lab (a namespace pinned by another host's mount
    namespace outlives `ip netns del`, and its veth blocks the name). This lab holds the subnet's lock, so
    anything named after it is stale."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(f"{lab.prefix}v") and name[len(lab.prefix) + 1:].isdigit():
            subprocess.run(["ip", "link", "del", name], capture_output=True)
