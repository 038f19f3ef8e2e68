"""Set-up run in each Ray worker process of a job (Ray's `worker_process_setup_hook`), shipped to every node with
the job (runtime_env `py_modules`): it imports nothing of verl_cluster, which the nodes may not have.

python_gc: freeze (VERL_CLUSTER_GC=freeze) - after a full collection that took FREEZE_MIN_S or more, the survivors
are frozen (gc.freeze: later full collections skip them). verl 0.9.1 never freezes or tunes Python's collector; a
0.5B run's workers hold a heap whose full collection takes 0.5-0.7 s, and those pauses land in whichever phase runs
(docs/placement.md, "One-step outliers"). Start-up's slow collections freeze the import and model heap; the short
ones after it freeze nothing, so a step's objects are not kept from the collector.
"""

import gc
import os
import time

FREEZE_MIN_S = float(os.environ.get("VERL_CLUSTER_GC_FREEZE_MIN_S", "0.05"))


def setup() -> None:
    if os.environ.get("VERL_CLUSTER_GC") == "freeze":
        install_freeze()


def install_freeze(min_s: float = FREEZE_MIN_S) -> None:
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        elif time.perf_counter() - started[0] >= min_s:
            gc.freeze()  # only moves the survivors to the permanent generation: safe inside the callback

    gc.callbacks.append(on_gc)
