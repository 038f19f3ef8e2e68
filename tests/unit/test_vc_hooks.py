"""The worker set-up that `python_gc: freeze` ships (verl_cluster/vc_hooks), in a real Python process: a slow full
collection freezes its survivors, a quick one freezes nothing, and without VERL_CLUSTER_GC it installs nothing."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = """import gc, sys
sys.path.insert(0, sys.argv[1])  # the folder as Ray's py_modules puts it: vc_hooks alone, no verl_cluster
import vc_hooks
vc_hooks.setup()
gc.disable()  # only the one collection below: an automatic one mid-build would freeze part of x and leave it quick
x = [[i] for i in range(int(sys.argv[2]))]
for a in x: a.append(a)
gc.collect()
print(len(gc.callbacks), gc.get_freeze_count())
"""


def run(n: int, **env) -> list[int]:
    r = subprocess.run([sys.executable, "-c", CODE, str(ROOT / "verl_cluster"), str(n)], capture_output=True,
                       text=True, timeout=120, env={**{k: v for k, v in os.environ.items() if not k.startswith(
                           "VERL_CLUSTER_GC")}, **env})
    assert r.returncode == 0, r.stderr
    return [int(w) for w in r.stdout.split()]


def test_a_slow_full_collection_freezes_its_survivors():
    callbacks, frozen = run(300000, VERL_CLUSTER_GC="freeze", VERL_CLUSTER_GC_FREEZE_MIN_S="0.001")
    assert callbacks == 1 and frozen >= 300000


def test_a_quick_one_freezes_nothing():
    assert run(10, VERL_CLUSTER_GC="freeze", VERL_CLUSTER_GC_FREEZE_MIN_S="5") == [1, 0]


def test_without_the_setting_nothing_is_installed():
    assert run(300000) == [0, 0]
