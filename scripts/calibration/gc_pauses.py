"""Python's garbage-collector pauses in every process of a grid run (a diagnosis for issue 33's one-step outliers:
verl 0.9.1 never freezes or disables the collector, and a full collection of a large heap can take seconds).

    installed as the staged site's sitecustomize.py (grid2_device.gc_watch): each Python process appends its pauses
    over PAUSE_S (GC_PAUSES_MIN_S, 0.05 s) to GC_PAUSES_DIR/<pid>.jsonl (wall time, generation, seconds, objects
    collected, the process's title: Ray names its actors there); while GC_PAUSES_DIR/freeze exists, each process
    freezes what survives a full collection (gc.freeze: the next ones scan only what came after);
    python3 gc_pauses.py summary DIR [--since EPOCH]   the longest pauses and each process's total
"""

import gc
import json
import os
import sys
import time

PAUSE_S = float(os.environ.get("GC_PAUSES_MIN_S", "0.05"))
FREEZE_FLAG = "freeze"  # GC_PAUSES_DIR/freeze: while it exists, full collections freeze their survivors


def _title() -> str:
    """The process's title as ps shows it (Ray's setproctitle: `ray::WorkerDict.actor_rollout_compute_log_prob`)."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return fh.read(400).replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return " ".join(sys.argv[:3])[:160]


def _install(folder: str) -> None:
    t0 = [0.0]
    path = os.path.join(folder, f"{os.getpid()}.jsonl")
    flag = os.path.join(folder, FREEZE_FLAG)  # looked at per full collection: Ray's idle workers started before it

    def cb(phase: str, info: dict) -> None:
        if phase == "start":
            t0[0] = time.perf_counter()
            return
        took = time.perf_counter() - t0[0]
        frozen = None
        if info.get("generation") == 2 and os.path.exists(flag):
            gc.freeze()  # safe here: it only moves the survivors to the permanent generation
            frozen = gc.get_freeze_count()
        if took >= PAUSE_S:
            try:
                with open(path, "a") as fh:  # rare (>= 50 ms): an open per pause costs nothing that matters
                    fh.write(json.dumps({"t": round(time.time(), 3), "gen": info.get("generation"),
                                         "s": round(took, 4), "collected": info.get("collected"),
                                         "title": _title(), **({"frozen": frozen} if frozen else {})}) + "\n")
            except OSError:
                pass

    gc.callbacks.append(cb)


def read(folder: str) -> list[dict]:
    """Every process's pauses, each with its pid."""
    rows = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, name)) as fh:
            rows += [{**json.loads(ln), "pid": name.split(".")[0]} for ln in fh if ln.strip()]
    return rows


def by_step(rows: list[dict], seen: dict) -> dict[int, list[dict]]:
    """The pauses of each step (from 2): those that ended between the step's console line and the one before
    (SEEN: step -> when its line reached the job's log, grid2_device.StepTimes)."""
    at = {int(k): float(v) for k, v in seen.items()}
    return {s: [r for r in rows if at[s - 1] <= r["t"] <= at[s]] for s in sorted(at) if s - 1 in at}


def summary(folder: str, since: float = 0.0) -> str:
    rows = [r for r in read(folder) if r["t"] >= since]
    if not rows:
        return f"gc pauses >= {PAUSE_S * 1000:.0f} ms: none in {folder}"
    top = sorted(rows, key=lambda r: -r["s"])[:12]
    out = [f"gc pauses >= {PAUSE_S * 1000:.0f} ms: {len(rows)} in {len({r['pid'] for r in rows})} processes, "
           f"{sum(r['s'] for r in rows):.1f} s in all; the longest:"]
    out += [f"  {time.strftime('%H:%M:%S', time.gmtime(r['t']))} pid {r['pid']} gen {r['gen']} {r['s']:.2f} s "
            f"({r['collected']} freed) {r.get('title') or r.get('argv')}" for r in top]
    return "\n".join(out)


if os.environ.get("GC_PAUSES_DIR") and __name__ == "sitecustomize":  # imported for its summary: nothing watched
    _install(os.environ["GC_PAUSES_DIR"])

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "summary":
        sys.exit(__doc__)
    print(summary(sys.argv[2], float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--since" else 0.0))
