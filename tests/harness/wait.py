"""Polling with a deadline, for tests and benchmarks on the namespace hosts."""

import time


def wait_for(pred, timeout: float, what: str, poll: float = 0.1) -> None:
    """Return once pred() is true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
