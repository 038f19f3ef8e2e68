"""Peak memory of this process while a reshard runs, sampled from /proc/self/status.

Reported: the peak of anonymous resident memory (what the reshard itself holds: tensors being assembled) and
the kernel's high-water mark of all resident memory (VmHWM). Page cache from reading and writing is neither.
"""

from __future__ import annotations

import threading
from pathlib import Path

STATUS = Path("/proc/self/status")


def _fields() -> dict[str, int]:
    out = {}
    try:
        for line in STATUS.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "VmHWM", "VmRSS"):
                out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


class PeakMemory:
    """A context that samples every `interval` seconds; `.peak_anon` and `.hwm` in bytes afterwards."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.peak_anon = 0
        self.start_anon = 0
        self.hwm = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        f = _fields()
        self.peak_anon = max(self.peak_anon, f.get("RssAnon", 0))
        self.hwm = max(self.hwm, f.get("VmHWM", 0))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "PeakMemory":
        self.start_anon = _fields().get("RssAnon", 0)
        self.sample()
        self._thread = threading.Thread(target=self._run, name="reshard-peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
