"""The job's `watch:` section turned into numbers the watcher uses."""

from __future__ import annotations

import re
from dataclasses import dataclass

from verl_cluster.config.job import JobSpec, WatchSpec
from verl_cluster.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$")
_UNIT = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def parse_duration(text: str, field: str, source: str) -> float:
    """Seconds from `90`, `90s`, `30m` or `2h`; bad input names the field and the file."""
    m = _DURATION.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"{source}: `{field}` must be a duration like 90, 90s, 30m or 2h; got {text!r}",
                          f"e.g. {field}=30m")
    return float(m.group(1)) * _UNIT[m.group(2)]


@dataclass(frozen=True)
class WatchSettings:
    max_restarts: int
    backoff_s: float
    backoff_max_s: float
    hang_after_s: float
    allow_fewer_nodes: bool
    node_wait_s: float
    notify: tuple[str, ...]
    node_grace_s: float = 60.0  # allow_fewer_nodes: lost at least this long before the run goes on without it
    poll_s: float = 1.0  # job status and new log lines
    node_check_s: float = 2.0  # GCS node table and raylet ports
    settle_s: float = 90.0  # for the GCS to fail a dead registration (Ray's health check: ~5 missed 3 s probes)
    clean_s: float = 90.0  # for a stopped attempt's actors, placement groups and GPU processes to go

    def backoff(self, restart: int) -> float:
        """Wait before restart number `restart` (1-based): backoff_s, doubling, capped."""
        return min(self.backoff_max_s, self.backoff_s * 2 ** max(0, restart - 1))


def settings_for(job: JobSpec) -> WatchSettings:
    w: WatchSpec = job.watch
    src = job.source
    for name in ("max_restarts", "backoff_s", "backoff_max_s", "node_wait_s", "node_grace_s"):
        if getattr(w, name) < 0:
            raise ConfigError(f"{src}: `watch.{name}` must be >= 0; got {getattr(w, name)}")
    if w.notify and not all(isinstance(a, str) and a for a in w.notify):
        raise ConfigError(f"{src}: `watch.notify` must be an argv list of non-empty strings",
                          "e.g. notify: [/usr/local/bin/notify-slack, '#training']")
    return WatchSettings(w.max_restarts, w.backoff_s, w.backoff_max_s,
                         parse_duration(w.hang_after, "watch.hang_after", src), w.allow_fewer_nodes, w.node_wait_s,
                         tuple(w.notify), w.node_grace_s)


def check_watchable(job: JobSpec) -> WatchSettings:
    """A watched run must be able to resume: verl finds its checkpoints under trainer.default_local_dir, and
    its default (relative to the driver's working folder) is gone after a restart."""
    s = settings_for(job)
    if not job.get("trainer.default_local_dir"):
        raise ConfigError(f"{job.source}: a watched run needs `trainer.default_local_dir` (where its checkpoints go)",
                          "set it under overrides: to a folder every node reads, e.g. "
                          "trainer.default_local_dir=/shared/ckpt/NAME")
    return s
