#!/usr/bin/env python3
"""verl across a node boundary on one multi-GPU machine: two hosts made of Linux namespaces (tests/harness/netns.py:
own network namespace on a bridge, own address, own sshd, own PID namespace, private /tmp and home), each owning
one GPU (per-node `env: {CUDA_VISIBLE_DEVICES}` and `gpus: 1`) and its own NCCL_HOSTID, so NCCL treats them as two
nodes and talks over sockets on the veth link: a socket link standing in for a cross-node one.

    python3 scripts/gpu/gpu_multinode.py PHASE [PHASE ...]     # as root, on the GPU machine, from a copy under /srv/vc
phases: setup (site, wrappers, models, data) | lab (hosts + cluster file) | s1 (up, status, check, NCCL evidence,
bench_nccl across the hosts) | s2 (plan + submit a GRPO user line on 2 nodes, 1 GPU each) | s3 (submit --watch with
watch.allow_fewer_nodes; the worker host dies for good after global_step_2; resumed resharded on the head) | s43 (the
worker's raylet killed after step 2 and healed, then the host lost for good after step 4, one run) | s5 (one host
with both GPUs, a WorkerDict killed after step 2) | down. Next session: setup lab s43 down s5 (~20 min).
Everything goes to /srv/vc/out (steps.log: each step's exit code and seconds). The lab stays up between phases run
by one process only: run the phases you want in one call (the hosts are this process's children).
Expects: scripts/gpu/gpu_sys_stage.sh's install.sh ran (ip, sshd) and scripts/gpu/gpu_stage_verl.sh's site is at
/root/stage/verl/site (moved to /srv/vc/site here). BUDGET_S (default 1500) stops starting new phases past it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

VC = Path("/srv/vc")
OUT = VC / "out"
SITE = VC / "site"
BIN = VC / "bin"
MODELS, DATA, CKPT = VC / "models", VC / "data" / "gsm8k", VC / "ckpt"
REPO = Path(__file__).resolve().parents[2]
PY = "/opt/torch/.venv/bin/python3" if Path("/opt/torch/.venv/bin/python3").exists() else sys.executable
T0 = time.time()
BUDGET_S = float(os.environ.get("BUDGET_S", "1500"))
# NVLink multicast stays off on these shared hosts; flashinfer is not staged
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "VLLM_USE_FLASHINFER_SAMPLER": "0", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
N = [0]


def log(msg: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} +{time.time() - T0:6.0f}s {msg}"
    print(line, flush=True)
    with open(OUT / "steps.log", "a") as fh:
        fh.write(line + "\n")


def env() -> dict:
    e = {**os.environ, **SAFE_ENV, "PYTHONPATH": f"{SITE}:{REPO}", "PATH": f"{BIN}:{SITE}/bin:{os.environ['PATH']}"}
    return e


def step(name: str, argv: list[str], limit: float, **kw) -> subprocess.CompletedProcess | None:
    """Run argv with its output in OUT/NN-name.log; returns the result (None when over budget)."""
    left = BUDGET_S - (time.time() - T0)
    if left < 20:
        log(f"SKIP {name} (budget)")
        return None
    N[0] += 1
    path = OUT / f"{N[0]:02d}-{name}.log"
    t = time.time()
    with open(path, "w") as fh:
        fh.write("$ " + " ".join(argv) + "\n")
        fh.flush()
        try:
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=fh, text=True, timeout=min(limit, left),
                               env=kw.pop("env", env()), cwd=kw.pop("cwd", REPO), **kw)
        except subprocess.TimeoutExpired as e:
            r = subprocess.CompletedProcess(argv, 124, e.stdout.decode() if isinstance(e.stdout, bytes) else
                                            (e.stdout or ""), "")
    (OUT / f"{N[0]:02d}-{name}.out").write_text(r.stdout or "")
    log(f"{N[0]:02d}-{name} rc={r.returncode} {time.time() - t:.1f}s")
    return r


# ---------------------------------------------------------------- setup
def setup() -> None:
    if not SITE.exists():
        staged = Path("/root/stage/verl/site")
        if not staged.exists():
            sys.exit("no staged site: run scripts/gpu/gpu_stage_verl.sh's calls first")
        shutil.move(str(staged), SITE)  # out of /root: each host's home is private
    wrappers()
    data()


def wrappers() -> None:
    """python/python3/ray on every host (over SSH the environment is bare): the image's Python with the site."""
    BIN.mkdir(parents=True, exist_ok=True)
    exports = " ".join(f"{k}={v}" for k, v in SAFE_ENV.items())
    head = (f"#!/bin/sh\nexport PYTHONPATH={SITE}${{PYTHONPATH:+:$PYTHONPATH}} PATH={BIN}:{SITE}/bin:$PATH {exports}\n")
    for name, tail in (("python", f'exec {PY} "$@"'), ("python3", f'exec {PY} "$@"'),
                       ("ray", f"exec {PY} -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = \"ray\"; "
                               f"sys.exit(main())' \"$@\"")):
        p = BIN / name
        p.write_text(head + tail + "\n")
        p.chmod(0o755)


def data() -> None:
    for d in (MODELS, DATA, CKPT):
        d.mkdir(parents=True, exist_ok=True)
    jobs = []
    for shape in ("tiny", "qwen2.5-0.5b"):
        if not (MODELS / shape / "config.json").exists():
            jobs.append(subprocess.Popen([str(BIN / "python3"), "scripts/make_tiny_model.py", "--shape", shape, "-o",
                                          str(MODELS / shape)], cwd=REPO, env=env(),
                                         stdout=open(OUT / f"model-{shape}.log", "w"), stderr=subprocess.STDOUT))
    if not (DATA / "train.parquet").exists():
        step("data", [str(BIN / "python3"), "scripts/prepare_gsm8k.py", "--synthetic", "2000", "--test-rows", "64",
                      "-o", str(DATA)], 180)
    for j in jobs:
        j.wait(400)
    log("setup: models " + ", ".join(sorted(p.name for p in MODELS.iterdir())))


# ---------------------------------------------------------------- lab
class Lab:
    def __init__(self, n_hosts: int = 2, gpus_per_host: int = 1, name: str = "mn") -> None:
        sys.path.insert(0, str(REPO))
        os.environ.setdefault("VC_LAB_TMP_SIZE", "24g")
        if not Path(os.environ.get("VC_LAB_SSHD", "/usr/sbin/sshd")).exists() and Path("/usr/local/sbin/sshd").exists():
            os.environ["VC_LAB_SSHD"] = "/usr/local/sbin/sshd"
        from tests.harness import netns

        netns.SSHD = os.environ.get("VC_LAB_SSHD", netns.SSHD)
        netns.TMP_SIZE = os.environ["VC_LAB_TMP_SIZE"]
        why = netns.integration_ready()
        if why:
            sys.exit(f"namespace hosts cannot be made here: {why}")
        self.gpus_per_host = gpus_per_host
        self.lab = netns.NetnsLab(name)
        self.hosts = [self.lab.add_host(f"n{i}") for i in range(n_hosts)]
        self.cluster = OUT / f"{name}.yaml"
        nodes = []
        for i, h in enumerate(self.hosts):
            gpus = ",".join(str(i * gpus_per_host + k) for k in range(gpus_per_host))
            e = {"CUDA_VISIBLE_DEVICES": gpus, "NCCL_HOSTID": f"vc-{name}-{h.name}", "NCCL_DEBUG": "INFO",
                 "NCCL_DEBUG_SUBSYS": "INIT,NET"}
            nodes.append(f"host: {h.ip}\n  gpus: {gpus_per_host}\n  env: {json.dumps(e)}\n")
        workers = "".join("  - " + n.replace("\n  ", "\n    ") for n in nodes[1:]) or " []\n"
        text = (f"cluster_name: {name}\nhead:\n  {nodes[0]}workers:" + ("\n" if nodes[1:] else "") + workers +
                f"ssh:\n  user: root\n  key_file: {self.lab.client_key}\n  known_hosts_file: {self.lab.known_hosts}\n"
                f"  connect_timeout_s: 5\nray:\n  ray_executable: {BIN / 'ray'}\n  object_store_memory: 4294967296\n")
        self.cluster.write_text(text)
        log(f"lab: {', '.join(f'{h.name}={h.ip}' for h in self.hosts)}; cluster file {self.cluster}")

    def grep_logs(self, host, pattern: str, limit: int = 40) -> str:
        r = host.run(["sh", "-c", f"grep -rhE '{pattern}' /tmp/vc-* 2>/dev/null | sort | uniq -c | sort -rn | "
                                  f"head -{limit}"], timeout=60)
        return r.stdout

    def kill_for_good(self, host) -> dict:
        """The host dies and does not return: every process in it (raylet, workers, sshd), then its link down."""
        t = time.time()
        self.lab.stop(host)
        i = self.hosts.index(host)
        subprocess.run(["ip", "link", "set", f"{self.lab.prefix}v{i}", "down"], check=False)
        return {"killed_at": t, "host": host.name, "ip": host.ip}

    def kill_raylet(self, host) -> dict:
        """The host stays (sshd answers); its raylet is SIGKILLed: `watch` heals it as `up` would."""
        t = time.time()
        r = host.run(["pkill", "-9", "-f", "ray/core/src/ray/raylet/raylet"], timeout=20)
        return {"killed_at": t, "host": host.name, "ip": host.ip, "what": "raylet", "rc": r.returncode}

    def close(self) -> None:
        self.lab.close()


def vc(*args: str) -> list[str]:
    return [str(BIN / "python3"), "-m", "verl_cluster", *args]


# ---------------------------------------------------------------- scenarios
def s1(lab: Lab) -> None:
    c = str(lab.cluster)
    step("up", vc("up", "-c", c), 240)
    step("status", vc("status", "-c", c, "--json"), 60)
    step("check", vc("check", "-c", c, "--json"), 400)
    step("check-table", vc("check", "-c", c), 400)
    for h in lab.hosts:
        (OUT / f"nccl-{h.name}.txt").write_text(lab.grep_logs(h, "NET/Socket|via NET|NCCL_HOSTID|Using network|"
                                                                "Bootstrap|NET/IB|P2P|SHM|comm 0x"))
    step("bench-nccl", [str(BIN / "python3"), "scripts/bench/bench_nccl.py", c, "--across-nodes", "--rounds", "2",
                        "--out", str(OUT / "bench_nccl.json")], 400)


PROBE = r"""
import datetime, os, sys, time, torch, torch.distributed as dist
rank = int(sys.argv[1]); master = sys.argv[2]
dist.init_process_group("nccl", init_method=f"tcp://{master}:29561", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=90), device_id=torch.device("cuda", 0))
t = torch.ones(64 << 18, device="cuda")
dist.all_reduce(t); torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(10):
    dist.all_reduce(t)
torch.cuda.synchronize()
dt = (time.perf_counter() - t0) / 10
print(f"rank {rank} sum {t[0].item():.0f} 64MiB all_reduce {dt * 1e3:.2f} ms busbw {(64 << 20) / dt / 1e9:.2f} GB/s")
dist.destroy_process_group()
"""


def probe(lab: Lab) -> None:
    """Before Ray: the two hosts' GPUs all-reduce through NCCL, and NCCL says which transport it took."""
    procs = []
    for i, h in enumerate(lab.hosts):
        e = {"CUDA_VISIBLE_DEVICES": str(i), "NCCL_HOSTID": f"vc-mn-{h.name}", "NCCL_DEBUG": "INFO",
             "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_SOCKET_IFNAME": "eth0", **SAFE_ENV}
        argv = ["nsenter", "-t", str(h.init_pid), "-n", "-p", "-m", "--", "env", *[f"{k}={v}" for k, v in e.items()],
                PY, "-c", PROBE, str(i), lab.hosts[0].ip]
        procs.append(subprocess.Popen(argv, stdout=open(OUT / f"probe-{h.name}.log", "w"), stderr=subprocess.STDOUT))
    for p in procs:
        try:
            p.wait(150)
        except subprocess.TimeoutExpired:
            p.kill()
    for h in lab.hosts:
        text = (OUT / f"probe-{h.name}.log").read_text()
        keep = [ln for ln in text.splitlines() if re.search(r"rank \d sum|NET/Socket|via NET|P2P|SHM|Error|error", ln)]
        log(f"probe {h.name}: " + " | ".join(keep[-8:])[:1500])


def user_line(name: str, model: str, steps: int, extra: list[str]) -> list[str]:
    return ["python3", "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
            f"data.train_files=[{DATA}/train.parquet]", f"data.val_files=[{DATA}/test.parquet]",
            "data.train_batch_size=32", "data.max_prompt_length=512", "data.max_response_length=384",
            f"actor_rollout_ref.model.path={MODELS / model}", "actor_rollout_ref.model.use_remove_padding=false",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "actor_rollout_ref.model.enable_gradient_checkpointing=true",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "actor_rollout_ref.rollout.enforce_eager=true",
            "trainer.logger=[console]", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
            f"trainer.total_training_steps={steps}", "trainer.save_freq=2", "trainer.test_freq=-1",
            "trainer.val_before_train=false", f"trainer.default_local_dir={CKPT / name}", *extra]


def s2(lab: Lab) -> None:
    c = str(lab.cluster)
    line = user_line("s2", "qwen2.5-0.5b", 4, [])
    step("plan-s2", vc("plan", "-c", c, "--json", "--", *line), 120)
    sampler = subprocess.Popen([PY, "scripts/gpu/gpu_mem_sampler.py", str(OUT / "nvml-s2.jsonl"), "--stop-file",
                                str(OUT / "stop-s2")], cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    step("submit-s2", vc("submit", "-c", c, "--json", "--", *line), 900)
    (OUT / "stop-s2").touch()
    try:
        sampler.wait(30)
    except subprocess.TimeoutExpired:
        sampler.kill()
    for h in lab.hosts:
        (OUT / f"nccl-s2-{h.name}.txt").write_text(lab.grep_logs(h, "NET/Socket|via NET|Using network|NET/IB"))
    (OUT / "ckpt-s2.txt").write_text(subprocess.run(["ls", "-laR", str(CKPT / "s2")], capture_output=True,
                                                    text=True).stdout[:20000])


def watched(lab: Lab, name: str, steps: int, faults: list, extra: list[str]) -> None:
    """`submit --watch` of the user line (tiny model) with faults injected one after another: each (tracker step,
    delay, action) fires when latest_checkpointed_iteration.txt says that step. Keeps the run folder and figures."""
    c = str(lab.cluster)
    if not any(ph in sys.argv[1:] for ph in ("s1", "s2")) or name == "s5":  # a lab of its own: its Ray is not up yet
        step(f"up-{name}", vc("up", "-c", c), 240)
    shutil.rmtree(CKPT / name, ignore_errors=True)
    line = user_line(name, "tiny", steps, [])
    if len(lab.hosts) == 1:
        line = [w for w in line if not w.startswith(("trainer.nnodes=", "trainer.n_gpus_per_node="))]
        line += ["trainer.nnodes=1", f"trainer.n_gpus_per_node={lab.gpus_per_host}"]
    done: list = []

    def inject() -> None:
        tracker = CKPT / name / "latest_checkpointed_iteration.txt"
        deadline = time.time() + 1500
        for at, delay, act in faults:
            while time.time() < deadline:
                try:
                    if tracker.read_text().strip() == str(at):
                        break
                except OSError:
                    pass
                time.sleep(0.5)
            time.sleep(delay)
            done.append({"after_step": at, **act()})
            log(f"{name}: fault {done[-1]}")

    threading.Thread(target=inject, daemon=True).start()
    step(f"submit-{name}", vc("submit", "-c", c, "watch.allow_fewer_nodes=true", "watch.backoff_s=2",
                              "watch.node_grace_s=20", "watch.node_wait_s=600", *extra, "--watch", "--", *line), 1500)
    (OUT / f"fault-{name}.json").write_text(json.dumps(done))
    runs = sorted(Path.home().glob(".verl-cluster/*/runs/*"), key=lambda p: p.stat().st_mtime)
    if runs:
        shutil.copytree(runs[-1], OUT / f"run-{name}", dirs_exist_ok=True)
    (OUT / f"ckpt-{name}.txt").write_text(subprocess.run(["ls", "-laR", str(CKPT / name)], capture_output=True,
                                                         text=True).stdout[:20000])


def s3(lab: Lab) -> None:
    """Scenario 3: the worker host dies for good 3 s after global_step_2; the run goes on on the head, resharded."""
    watched(lab, "s3", 6, [(2, 3, lambda: lab.kill_for_good(lab.hosts[1]))], [])


def s43(lab: Lab) -> None:
    """Scenarios 4 then 3 in one run: the worker's raylet killed after step 2 (healed, resumed on both nodes), then
    the worker host lost for good after step 4 (resumed on the head from step 4, resharded) -> SUCCEEDED at 8."""
    watched(lab, "s43", 8, [(2, 3, lambda: lab.kill_raylet(lab.hosts[1])),
                            (4, 3, lambda: lab.kill_for_good(lab.hosts[1]))], [])


def s5(lab: Lab) -> None:
    """Scenario 5: one node with 2 GPUs, a WorkerDict SIGKILLed after step 2: detect, RUNNING again, first new step."""
    def kill_worker() -> dict:
        t = time.time()
        r = lab.hosts[0].run(["pkill", "-9", "-f", "^ray::WorkerDict"], timeout=20)
        return {"killed_at": t, "what": "ray::WorkerDict", "rc": r.returncode}

    watched(lab, "s5", 4, [(2, 2, kill_worker)], [])


def main() -> int:
    import resource

    OUT.mkdir(parents=True, exist_ok=True)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # Ray wants 65536; the hosts inherit it
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(65536, hard), hard))
    phases = sys.argv[1:] or ["setup", "lab", "s1", "s2", "s3", "down"]
    log(f"phases {' '.join(phases)} (budget {BUDGET_S:.0f}s)")
    lab = None
    try:
        for ph in phases:
            if time.time() - T0 > BUDGET_S - 20:
                log(f"SKIP {ph} (budget)")
                continue
            t = time.time()
            if ph == "setup":
                setup()
            elif ph == "wrappers":  # a dry run off the GPU machine: the hosts run this Python
                wrappers()
            elif ph == "lab":
                lab = Lab()
            elif ph in ("probe", "s1", "s2", "s3", "s43"):
                lab = lab or Lab()
                globals()[ph](lab)
            elif ph == "s5":  # a host of its own with both GPUs (the two-host lab is closed first)
                if lab:
                    step("down", vc("down", "-c", str(lab.cluster)), 120)
                    lab.close()
                lab = Lab(n_hosts=1, gpus_per_host=2, name="one")
                s5(lab)
            elif ph == "down" and lab:
                step("down", vc("down", "-c", str(lab.cluster)), 120)
            log(f"phase {ph} done in {time.time() - t:.0f}s")
    finally:
        if lab:
            lab.close()
        log("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
