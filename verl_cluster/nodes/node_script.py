"""Node-side helper, shipped as source and run with the node's Python (`python -c SOURCE CMD ARGS`).

Stdlib only (ray is imported where present); shipped after the NVML reader's source (facts/nvml_node.py) and the
temp dir rules (nodes/temp_dir_node.py). Commands:
  probe TEMP_DIR [GCS [OLD]]  versions, GPUs (NVML), this cluster's Ray processes (or those of its OLD temp dir),
                          saved start state, what is unsafe about TEMP_DIR here
  kill TEMP_DIR [GCS [OLD]]   stop exactly the Ray processes of this TEMP_DIR (and OLD) and their children, verify
  start TEMP_DIR -- ARGV  create TEMP_DIR (new folders 0700), refuse it if unsafe, then exec ARGV (`ray start`)
                          from inside it: Ray's daemons keep that cwd, which no one removes under them
  gcs ADDR [DASHBOARD]    node table from the GCS (+ jobs from the Jobs API)
  wait ADDR HEAD EXPECT T poll the GCS until the expected nodes are alive (one process, not one per poll)
  stacks TEMP_DIR SID JOB PYSPY LIMIT ACTORS  py-spy dumps of one Ray job's Python processes here
  gpuhealth SINCE N       GPU faults: NVML (GPUs lost or fewer than N, uncorrected ECC), kernel Xid lines
  jobprocs TEMP_DIR JOB K ACTORS  the job's processes left here (state, RSS, GPU MiB), NVML per GPU; K=1 kills
  joblogs TEMP_DIR JOB N ACTORS  the last N lines of each of one Ray job's worker logs here
Prints its JSON result after a marker line (see runners.remote_python).
"""

import json
import os
import re
import signal
import socket
import sys
import time

if "open_nvml" not in globals():  # imported here as a module; shipped, the reader's source comes first
    from verl_cluster.facts.nvml_node import NvmlError, open_nvml
if "prepare_temp_dir" not in globals():
    from verl_cluster.nodes.temp_dir_node import prepare_temp_dir, temp_dir_problem

MARK = "@@VC-JSON@@"


def emit(data):
    print(MARK + json.dumps(data, default=str), flush=True)


def read_procs():
    """pid -> (ppid, cmdline) for every process we can see."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        procs[int(name)] = (ppid, cmd)
    return procs


def this_and_parents(procs):
    """This script's pid and its parents' (timeout, env, sshd): they carry the temp dir's path too."""
    mine, pid = set(), os.getpid()
    while pid in procs and pid not in mine:
        mine.add(pid)
        pid = procs[pid][0]
    return mine


def with_descendants(roots, procs, mine):
    """ROOTS (a set of pids) and every descendant of theirs, MINE left out."""
    found, grew = set(roots), True
    while grew:
        grew = False
        for pid, (ppid, _) in procs.items():
            if ppid in found and pid not in found and pid not in mine:
                found.add(pid)
                grew = True
    return found


def ours(temp_dir, procs=None, gcs_address=None):
    """Processes of the Ray started with --temp-dir TEMP_DIR, and all their descendants. Ray's client
    server names no temp dir: it is recognised by the node id of our raylet/GCS, or the GCS address."""
    procs = procs if procs is not None else read_procs()
    mine = this_and_parents(procs)
    pat = re.compile(r"(^|[=\s])" + re.escape(temp_dir.rstrip("/")) + r"(/|\s|$)")
    # srun clients name the temp dir too (verl-cluster running on a node of its own Slurm allocation): they
    # are how we reach nodes, not Ray; ending Ray's step ends its srun
    found = {pid for pid, (_, cmd) in procs.items()
             if pid not in mine and pat.search(cmd) and cmd.split(" ", 1)[0].rsplit("/", 1)[-1] != "srun"}
    marks = {f"--node-id={m}" for pid in found for m in re.findall(r"--node[_-]id=([0-9a-f]+)", procs[pid][1])}
    if gcs_address and found:  # with none of our Ray here, a client server at that address is another Ray's
        marks.add(f"--address={gcs_address}")
    found |= {pid for pid, (_, cmd) in procs.items()
              if pid not in mine and "ray.util.client.server" in cmd and marks & set(cmd.split())}
    found = with_descendants(found, procs, mine)  # ray::IDLE workers rename themselves and lose the path
    return {pid: procs[pid][1] for pid in found}


def ours_and_old(temp_dir, old_temp_dir, procs, gcs_address=None):
    """(processes of TEMP_DIR, of the cluster's earlier temp dir): both name the same GCS address, so the client
    server found by it goes with the earlier one only when Ray runs there and not under TEMP_DIR."""
    old = ours(old_temp_dir, procs) if old_temp_dir else {}
    if old and not ours(temp_dir, procs):
        return {}, ours(old_temp_dir, procs, gcs_address)
    return ours(temp_dir, procs, gcs_address), old


def kind(cmd):
    for k in ("gcs_server", "raylet", "dashboard.py", "log_monitor", "monitor.py", "agent.py", "ray.util.client"):
        if k in cmd.split(" ", 1)[0] or (k.endswith(".py") and k in cmd):
            return k.replace(".py", "")
    return cmd.split(" ", 1)[0].rsplit("/", 1)[-1][:40]


def with_nvml(read, nvml, without):
    """read(nvml) with the caller's NVML (it closes it), else one opened and closed here; without(error) when there
    is none (no driver, no GPU)."""
    if nvml is not None:
        return read(nvml)
    nvml, error = open_nvml()
    if nvml is None:
        return without(error)
    try:
        return read(nvml)
    finally:
        nvml.close()


def gpus(nvml=None):
    """([per-GPU name and memory], why not); `nvml`: as for with_nvml."""
    return with_nvml(_gpus, nvml, lambda error: ([], error))


def _gpus(nvml):
    out = []
    for i in range(nvml.count()):
        h = nvml.handle(i)
        total, free = nvml.memory(h)
        out.append({"index": i, "name": nvml.name(h),
                    "memory_total_mib": total // 2**20, "memory_free_mib": free // 2**20})
    return out, None


def version(dist):
    try:
        from importlib.metadata import version as v

        return v(dist)
    except Exception:
        return None


def siblings(temp_dir, procs):
    """Other clusters of ours whose Ray (raylet or GCS) runs on this machine: their temp dirs sit beside ours in
    this user's folder (/tmp/vc-UID/NAME). verl's jobs on two clusters of one machine share /tmp."""
    folder, me = os.path.split(temp_dir.rstrip("/"))
    if not os.path.basename(folder).startswith("vc-"):  # a temp dir of the user's choosing: its neighbours are not ours
        return []
    pat = re.compile(r"(?:^|[=\s])" + re.escape(folder) + r"/([^/\s]+)")
    names = set()
    for _, cmd in procs.values():
        if kind(cmd) in ("raylet", "gcs_server"):
            names.update(n for n in pat.findall(cmd) if n != me and not n.startswith("session_"))
    return sorted(names)


def cmd_probe(temp_dir, gcs_address=None, old_temp_dir=None):
    """A cluster that runs under its OLD temp dir only is reported as running (its kinds, pids, state), with
    old_kinds saying so."""
    procs = read_procs()
    found, old = ours_and_old(temp_dir, old_temp_dir, procs, gcs_address)
    where = temp_dir if found or not old else old_temp_dir
    found = found or old
    kinds = sorted({kind(c) for c in found.values()})
    state = None
    try:
        with open(os.path.join(where, "vc-node.json")) as f:
            state = json.load(f)
    except (OSError, ValueError):
        pass
    g, nvml_error = gpus()
    emit({"hostname": socket.gethostname(), "home": os.path.expanduser("~"),
          "python": sys.version.split()[0], "ray_version": version("ray"),
          "gpus": g, "nvml_error": nvml_error, "kinds": kinds, "pids": sorted(found),
          "raylet": "raylet" in kinds, "gcs": "gcs_server" in kinds, "state": state,
          "old_kinds": sorted({kind(c) for c in old.values()}), "temp_dir_problem": temp_dir_problem(temp_dir),
          "siblings": siblings(temp_dir, procs)})


def cmd_start(temp_dir, sep, *argv):
    """Exec `ray start` from inside its temp dir, once the temp dir is ready and judged safe; a refusal is one JSON
    line ({"refused": [what, fix]}) and exit 2, before anything is started."""
    if sep != "--" or not argv:
        sys.exit("usage: start TEMP_DIR -- ARGV")
    problem = prepare_temp_dir(temp_dir)
    if problem:
        emit({"refused": problem})
        sys.exit(2)
    os.chdir(temp_dir)
    sys.stdout.flush()
    try:
        os.execvp(argv[0], list(argv))
    except OSError as e:  # one line in `up`'s report, not a traceback
        sys.exit(f"cannot run {argv[0]}: {e.strerror or e}")


def in_dirs(folders, pid):
    """Whether PID's working directory is one of FOLDERS or under it (`start` runs Ray from its temp dir)."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return any(cwd == f.rstrip("/") or cwd.startswith(f.rstrip("/") + "/") for f in folders)


def forked_since(found, procs, folders=()):
    """Processes of ours that FOUND missed: children forked since it was read, and processes whose parent is gone but
    who still work in one of FOLDERS (a dashboard module's forkserver child restarted during the shutdown, reparented
    when its parent died: its command line names no temp dir). This script and its parents excluded."""
    mine = this_and_parents(procs)
    orphans = {pid for pid in procs if folders and pid not in found and pid not in mine and in_dirs(folders, pid)}
    new = with_descendants(set(found) | orphans, procs, mine) - set(found)
    return {pid: procs[pid][1] for pid in new}


def cmd_kill(temp_dir, gcs_address=None, old_temp_dir=None):
    found, old = ours_and_old(temp_dir, old_temp_dir, read_procs(), gcs_address)
    found.update(old)
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0), (signal.SIGKILL, 5.0)):
        procs = read_procs()
        found.update(forked_since(found, procs, [d for d in (temp_dir, old_temp_dir) if d]))
        targets = [p for p in found if p in procs and not zombie(p)]  # only what is still there
        if not targets and sig == signal.SIGKILL:
            break
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while time.time() < deadline:
            alive = [p for p in found if os.path.exists(f"/proc/{p}") and not zombie(p)]
            if not alive:
                break
            time.sleep(0.1)
    left = [p for p in found if os.path.exists(f"/proc/{p}") and not zombie(p)]
    for folder in filter(None, (temp_dir, old_temp_dir)):
        try:
            os.remove(os.path.join(folder, "vc-node.json"))
        except OSError:
            pass
    emit({"stopped": len(found) - len(left), "left": left,
          "kinds": sorted({kind(c) for c in found.values()})})


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def node_row(info):
    """One GCS node entry as JSON. Ray's GcsClient is not a public API: fields a Ray version lacks get defaults."""
    return {"node_id": info.node_id.hex(), "ip": info.node_manager_address, "alive": info.state == 0,
            "is_head": bool(getattr(info, "is_head_node", False)),
            "resources": dict(getattr(info, "resources_total", {}) or {}),
            "labels": dict(getattr(info, "labels", {}) or {}), "start_time_ms": getattr(info, "start_time_ms", 0)}


def gcs_client(addr):
    try:
        from ray._raylet import GcsClient
    except ImportError as e:  # this Ray moved its GCS client: say so instead of a traceback
        raise RuntimeError(f"this Ray ({version('ray')}) has no ray._raylet.GcsClient: {e}")
    return GcsClient(address=addr)


def refused(addr, timeout=3.0):
    """Why nothing takes a TCP connection at ADDR (host:port), else None: Ray's GcsClient waits ~40 s for a port
    nobody listens on."""
    host, _, port = addr.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as e:
        return f"nothing answers at {addr}: {e}"
    return None


def cmd_gcs(addr, dashboard=None):
    why = refused(addr)
    if why:
        emit({"nodes": [], "jobs": [], "jobs_error": None, "error": why, "refused": True})
        return
    try:
        client = gcs_client(addr)
        nodes = [node_row(i) for i in client.get_all_node_info(timeout=10).values()]
    except Exception as e:  # reported by the caller as a problem, not a traceback
        emit({"nodes": [], "jobs": [], "jobs_error": None, "error": f"{type(e).__name__}: {str(e).strip()[:300]}"})
        return
    available = {}
    try:
        reply = client.get_all_resource_usage(timeout=10)
        for u in reply.resource_usage_data.batch:
            available[u.node_id.hex()] = dict(u.resources_available)
    except Exception:
        pass
    for n in nodes:
        n["available"] = available.get(n["node_id"])
    jobs, jobs_error = [], None
    if dashboard:
        try:
            from ray.job_submission import JobSubmissionClient

            for j in JobSubmissionClient(dashboard).list_jobs():
                jobs.append({"id": j.submission_id or j.job_id, "status": str(j.status.value),
                             "entrypoint": (j.entrypoint or "")[:200], "start_time": j.start_time})
        except Exception as e:
            jobs_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    emit({"nodes": nodes, "jobs": jobs, "jobs_error": jobs_error})


def cmd_wait(addr, head_ip, expect_json, timeout_s):
    """Poll the GCS in this one process until every expected node (ip -> min GPUs) is ALIVE with its GPUs,
    or the time is up; print the last node table either way."""
    expect = json.loads(expect_json)
    deadline = time.time() + float(timeout_s)
    client, nodes, error = None, [], None
    while True:
        try:
            client = client or gcs_client(addr)
            nodes = [node_row(i) for i in client.get_all_node_info(timeout=5).values()]
            error = None
        except Exception as e:  # the GCS may still be starting
            client, error = None, f"{type(e).__name__}: {str(e)[:200]}"
        alive = [n for n in nodes if n["alive"]]
        done = True
        for ip, gpus in expect.items():
            mine = [n for n in alive if n["ip"] == ip or (ip == head_ip and n["is_head"])]
            if not any(n["resources"].get("GPU", 0) >= gpus for n in mine):
                done = False
        if done or time.time() > deadline:
            emit({"nodes": nodes, "jobs": [], "jobs_error": None, "error": error, "done": done})
            return
        time.sleep(0.3)


def gpu_faults(expect):
    """NVML's view of GPU health: a GPU that is gone (fewer than `expect`, or 'GPU is lost'), uncorrected ECC
    errors since the driver loaded. None when NVML cannot be read here (no driver: nothing to judge)."""
    nvml, _ = open_nvml()
    if nvml is None:
        return None
    try:
        try:
            n = nvml.count()
        except NvmlError:
            return None
        faults = []
        if expect and n < expect:
            faults.append(f"NVML sees {n} GPU(s), {expect} when the node started (a GPU fell off the bus)")
        for i in range(n):
            try:
                h = nvml.handle(i)
                nvml.memory(h)
            except NvmlError as e:
                faults.append(f"GPU {i}: {e.named()}")
                continue
            ecc = nvml.ecc_uncorrected(h, volatile=True)  # None: ECC off or not supported (consumer GPUs)
            if ecc:
                faults.append(f"GPU {i}: {ecc} uncorrected ECC error(s) since the driver loaded")
        return faults
    finally:
        nvml.close()


def kernel_xids(since):
    """The kernel's NVRM Xid lines since a time: journalctl -k, else dmesg (GPU machines often lack journald).
    [] when neither can be read."""
    import subprocess

    def run(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=15).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None

    out = run(["journalctl", "-k", "--no-pager", "-q", "-o", "short-iso", "--since", f"@{int(since)}",
               "--grep", "NVRM: Xid"])
    if out is not None:
        return [x for x in out.splitlines() if "Xid" in x][-20:]
    return xids_since((run(["dmesg", "--time-format=iso"]) or "").splitlines(), since)


def xids_since(lines, since):
    """Xid lines of `dmesg --time-format=iso` at or after `since` (epoch seconds): older ones are an earlier
    fault, not this attempt's."""
    from datetime import datetime

    found = []
    for x in lines:
        if "Xid" not in x:
            continue
        try:
            t = datetime.fromisoformat(x.split(" ", 1)[0].replace(",", ".")).timestamp()
        except ValueError:
            continue
        if t >= since:
            found.append(x)
    return found[-20:]


def cmd_gpuhealth(since="0", expect="0"):
    faults = gpu_faults(int(expect))
    emit({"hostname": socket.gethostname(), "nvml": faults is not None, "faults": faults or [],
          "xid": kernel_xids(float(since))})


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
    except OSError:
        return {}


def proc_state(pid):
    """(state letter, RSS MiB): R running, S sleeping, T stopped (SIGSTOP), Z zombie, D in I/O."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[21]) * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (OSError, IndexError, ValueError):
        return "?", 0


def gpu_procs(nvml=None):
    """pid -> (GPU index, MiB) of the compute processes NVML lists; {} without NVML. `nvml`: as for with_nvml."""
    return with_nvml(_gpu_procs, nvml, lambda error: {})


def _gpu_procs(nvml):
    try:
        out = {}
        for i in range(nvml.count()):
            for pid, used in nvml.compute_processes(nvml.handle(i)):
                out[int(pid)] = (i, int((used or 0) // 2**20))
        return out
    except (NvmlError, AttributeError):  # AttributeError: a driver without the _v2/_v3 call
        return {}


def job_procs(temp_dir, job_id, procs=None, mine=None):
    """pid -> command of the processes here that belong to Ray job `job_id` of this cluster's Ray: they carry the
    job in RAY_JOB_ID (children inherit it: vLLM's engine and workers too) and either descend from our Ray or,
    orphaned when their parent died, name our raylet in RAY_RAYLET_PID (another cluster's job 01000000 does not).
    `mine`: ours(temp_dir, procs) when the caller has it already."""
    procs = procs if procs is not None else read_procs()
    mine = mine if mine is not None else ours(temp_dir, procs)
    raylets = {str(pid).encode() for pid, cmd in mine.items() if kind(cmd) == "raylet"}
    out = {}
    for pid, (_, cmd) in procs.items():
        env = environ(pid) if job_id else {}
        if env.get(b"RAY_JOB_ID", b"").decode() != job_id or pid == os.getpid():
            continue
        if pid in mine or env.get(b"RAY_RAYLET_PID") in raylets:
            out[pid] = cmd
    return out


def cmd_jobprocs(temp_dir, job_id, kill="0", actors=""):
    """The job's processes still here (state, RSS, GPU memory) and NVML's memory per GPU; kill=1: SIGKILL them
    first (what is left of an attempt that was stopped), then look again. `actors`: as for stacks."""
    def of_job(procs=None):
        procs = procs if procs is not None else read_procs()
        mine = ours(temp_dir, procs)
        return {**job_procs(temp_dir, job_id, procs, mine), **actor_procs_here(actors, mine)}

    killed = []
    if kill == "1":
        for pid, cmd in of_job().items():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append({"pid": pid, "cmd": cmd[:120]})
            except OSError:
                pass
        if killed:
            time.sleep(1.0)
    nvml, _ = open_nvml()  # one init for the processes and the GPUs: init is NVML's slow call
    try:
        on_gpu = gpu_procs(nvml) if nvml is not None else {}
        procs = read_procs()
        left = []
        for pid, cmd in sorted(of_job(procs).items()):
            state, rss = proc_state(pid)
            if state == "Z":
                continue  # exited; its parent has not reaped it yet: holds nothing
            gpu = on_gpu.get(pid)
            left.append({"pid": pid, "cmd": cmd[:120], "state": state, "rss_mib": rss,
                         "gpu": gpu[0] if gpu else None, "gpu_mib": gpu[1] if gpu else 0})
        g, _ = gpus(nvml) if nvml is not None else ([], None)
    finally:
        if nvml is not None:
            nvml.close()
    emit({"hostname": socket.gethostname(), "left": left, "killed": killed,
          "gpus": [{"index": x["index"], "used_mib": x["memory_total_mib"] - x["memory_free_mib"],
                    "total_mib": x["memory_total_mib"]} for x in g],
          "gpu_procs": [{"pid": pid, "gpu": i, "mib": mib, "cmd": procs.get(pid, (0, "?"))[1][:80]}
                        for pid, (i, mib) in sorted(on_gpu.items())]})


def cmd_joblogs(temp_dir, job_id, lines="40", actors=""):
    """The last lines of each of the job's worker logs here (Ray names them worker-<id>-<job id>-<pid>.out/.err;
    a pooled worker's name has the nil job id ffffffff, so the job's actors (`actors`, as for stacks) add theirs)."""
    import glob

    n = int(lines)
    logs = os.path.join(temp_dir, "session_latest", "logs")
    found = set(glob.glob(os.path.join(logs, f"worker-*-{job_id}-*"))) if job_id else set()
    for pid in actor_procs_here(actors, ours(temp_dir) if actors else {}):
        found |= {f for ext in ("out", "err") for f in glob.glob(os.path.join(logs, f"worker-*-{pid}.{ext}"))}
    found = sorted(found, key=os.path.getmtime, reverse=True)[:40]
    out = []
    for path in found:
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 200 * n))
                tail = f.read().decode(errors="replace").splitlines()[-n:]
        except OSError:
            continue
        if any(x.strip() for x in tail):
            out.append({"file": os.path.basename(path), "lines": tail})
    emit({"hostname": socket.gethostname(), "logs": out})


SHELLS = {"bash", "sh", "dash", "zsh", "env", "timeout", "setsid", "nohup"}


def node_ids(mine):
    """Ray node ids of this cluster's processes here (`mine`: ours(); the raylet and its helpers name it on their
    command line)."""
    return {m for cmd in mine.values() for m in re.findall(r"--node[_-]id=([0-9a-f]+)", cmd)}


def actor_procs_here(actors, mine):
    """pid -> command of the job's actors running here: `actors` is "NODE_ID_PREFIX:PID:CLASS,..." from Ray's actor
    table; a pid counts only on its node, in our Ray, under its actor's title (ray::CLASS...), so a pid that a
    dead actor left and another process took is not taken for it. `mine`: ours() here."""
    here = node_ids(mine) if actors else set()
    out = {}
    for pair in filter(None, actors.split(",")):
        node_id, _, rest = pair.partition(":")
        pid, _, cls = rest.partition(":")
        if not (node_id and pid.isdigit() and any(h.startswith(node_id) for h in here)) or int(pid) not in mine:
            continue
        if mine[int(pid)].startswith("ray::" + cls):
            out[int(pid)] = mine[int(pid)]
    return out


def job_pids(temp_dir, sid, job_id, actors=""):
    """Our Ray's processes that belong to one job: its workers carry RAY_JOB_ID, its driver the Jobs API's
    metadata (job_submission_id) in its environment. `actors` (see actor_procs_here) adds the job's actors: one
    that runs in a worker Ray started before the job (a pooled one) carries no RAY_JOB_ID of the job."""
    out = []
    procs = read_procs()
    mine = ours(temp_dir, procs)
    workers = job_procs(temp_dir, job_id, procs, mine) if job_id else {}
    workers.update(actor_procs_here(actors, mine))
    for pid, cmd in sorted({**mine, **workers}.items()):
        if not cmd:
            continue  # an empty command line is a zombie or a process mid-exec: nothing to dump yet
        env = environ(pid)
        driver = b'"job_submission_id": "' + sid.encode() + b'"' in env.get(b"RAY_JOB_CONFIG_JSON_ENV_VAR", b"")
        if not (driver or pid in workers):
            continue
        exe = cmd.split(" ", 1)[0]
        if driver and os.path.basename(exe) in SHELLS:
            continue  # `submit run.sh`: the shell holds no Python stack; its python child carries the same env
        if driver or "python" in exe or cmd.startswith(("ray::", "VLLM", "EngineCore")):
            role = "driver" if driver else ("vllm" if "VLLM" in exe or "EngineCore" in exe else "worker")
            out.append((pid, role, cmd[:120]))
    return out


def cmd_stacks(temp_dir, sid, job_id="", pyspy="", limit="24", actors=""):
    import shutil
    import subprocess

    exe = pyspy if pyspy and os.path.exists(pyspy) else shutil.which("py-spy")
    pids = job_pids(temp_dir, sid, job_id, actors)
    dumps = []
    for pid, role, cmd in pids[:int(limit)]:
        state, rss = proc_state(pid)
        text, err = "", ""
        if exe:
            # a stopped process cannot be paused for the dump: read it as it is (--nonblocking)
            argv = [exe, "dump", "--pid", str(pid)] + (["--nonblocking"] if state == "T" else [])
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
                text, err = r.stdout, (r.stderr.strip().splitlines() or [""])[-1] if r.returncode else ""
            except (OSError, subprocess.TimeoutExpired) as e:
                err = str(e)
        dumps.append({"pid": pid, "role": role, "cmd": cmd, "state": state, "rss_mib": rss, "stack": text[-6000:],
                      "error": err[:300]})
    emit({"hostname": socket.gethostname(), "pyspy": exe, "processes": len(pids), "dumps": dumps})


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"probe": cmd_probe, "kill": cmd_kill, "start": cmd_start, "gcs": cmd_gcs, "wait": cmd_wait, "stacks": cmd_stacks,
     "gpuhealth": cmd_gpuhealth, "jobprocs": cmd_jobprocs,
     "joblogs": cmd_joblogs}[cmd](*args)
