"""Node-side fact probe. STDLIB ONLY: this file is shipped as source and run with the node's Python
(`python -c SOURCE [HEAD_IP]`), after the NVML reader's source (facts/nvml_node.py), and also run by
scripts/calibration/record_facts.py on machines that have nothing else.

It prints one JSON line (see runners.remote_python.MARK) whose keys are the fields of facts.model.NodeFacts.
Every probe is guarded: a missing tool or library becomes a missing fact (plus a reason), never a crash.
"""

import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import time

if "open_nvml" not in globals():  # imported here as a module; shipped, the reader's source comes first
    from verl_cluster.facts.nvml_node import NvmlError, open_nvml

MARK = "@@VC-JSON@@"
SYS_NET = "/sys/class/net"
SYS_IB = "/sys/class/infiniband"
RDMA_TRANSPORTS = ("rc", "rc_verbs", "rc_mlx5", "ud", "ud_verbs", "ud_mlx5", "dc", "dc_mlx5", "ib")
VIRTUAL_PREFIXES = ("docker", "veth", "br-", "virbr", "cni", "flannel", "cali", "vxlan", "tun", "tap", "lxc")


def _run(argv, timeout=10.0, env=None):
    """(rc, stdout, stderr) or None when the tool is missing or hangs."""
    if not shutil.which(argv[0]) and not os.path.isabs(argv[0]):
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.returncode, p.stdout, p.stderr


def _read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


# ---------------------------------------------------------------- network
def _iface_kind(name, linkinfo_kind=""):
    if name == "lo":
        return "loopback"
    if linkinfo_kind:
        return linkinfo_kind  # veth, bridge, dummy, vxlan, ...
    if os.path.isdir(os.path.join(SYS_NET, name, "bridge")):
        return "bridge"
    if name.startswith("docker"):
        return "docker"
    if _read(os.path.join(SYS_NET, name, "type")) == "32":
        return "ib"
    if not os.path.exists(os.path.join(SYS_NET, name, "device")):
        return "virtual"
    return "ether"


def interfaces():
    out = _run(["ip", "-d", "-j", "addr", "show"])
    if out and out[0] == 0:
        try:
            result = []
            for link in json.loads(out[1]):
                addrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])
                         if a.get("family") == "inet"]
                kind = (link.get("linkinfo") or {}).get("info_kind", "")
                up = "UP" in link.get("flags", []) and link.get("operstate") != "DOWN"
                result.append({"name": link["ifname"], "addresses": addrs, "mtu": int(link.get("mtu", 0)),
                               "up": up, "kind": _iface_kind(link["ifname"], kind)})
            return result
        except (ValueError, KeyError):
            pass
    # no `ip` (some GPU machines): /sys for links, an ioctl for the primary IPv4 address
    result = []
    for name in sorted(os.listdir(SYS_NET)) if os.path.isdir(SYS_NET) else []:
        addr = _ioctl_addr(name)
        result.append({"name": name, "addresses": [addr] if addr else [],
                       "mtu": int(_read(os.path.join(SYS_NET, name, "mtu"), "0") or 0),
                       "up": _read(os.path.join(SYS_NET, name, "operstate")) in ("up", "unknown"),
                       "kind": _iface_kind(name)})
    return result


def _ioctl_addr(name):
    import fcntl
    import struct
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("256s", name.encode()[:15])
            ip = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
            mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x891B, req)[20:24])  # SIOCGIFNETMASK
        bits = sum(bin(int(x)).count("1") for x in mask.split("."))
        return f"{ip}/{bits}"
    except OSError:
        return None


def route_to(ip, ifaces):
    """Interface name and source address the kernel uses to reach `ip`."""
    out = _run(["ip", "-j", "route", "get", ip])
    if out and out[0] == 0:
        try:
            r = json.loads(out[1])[0]
            return r.get("dev"), r.get("prefsrc")
        except (ValueError, IndexError):
            pass
    # fallback: a connected UDP socket sends nothing but tells which source address would be used
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            src = s.getsockname()[0]
    except OSError:
        return None, None
    for i in ifaces:
        if any(a.split("/")[0] == src for a in i["addresses"]):
            return i["name"], src
    return None, src


def rdma():
    devices, ports = [], []
    if os.path.isdir(SYS_IB):
        for dev in sorted(os.listdir(SYS_IB)):
            devices.append(dev)
            pdir = os.path.join(SYS_IB, dev, "ports")
            for port in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
                if "ACTIVE" in _read(os.path.join(pdir, port, "state")):
                    ports.append(f"{dev}:{port}")
    return devices, ports


def ucx():
    version, transports = None, []
    v = _run(["ucx_info", "-v"])
    if v and v[0] == 0:
        for line in v[1].splitlines():
            if "Version" in line:
                version = line.split("Version", 1)[1].strip()
                break
    d = _run(["ucx_info", "-d"], timeout=20)
    if d and d[0] == 0:
        for line in d[1].splitlines():
            line = line.strip().lstrip("#").strip()
            if line.startswith("Transport:"):
                t = line.split(":", 1)[1].strip()
                if t not in transports:
                    transports.append(t)
    return version, transports


# ---------------------------------------------------------------- GPUs (NVML: facts/nvml_node.py)
def gpus():
    """(gpus, pairs, driver, cuda, error)."""
    nvml, error = open_nvml()
    if nvml is None:
        return [], [], None, None, error
    try:
        handles = [nvml.handle(i) for i in range(nvml.count())]
        infos = [nvml.gpu(i, h) for i, h in enumerate(handles)]
        pairs = [nvml.pair(a, handles[a], b, handles[b])
                 for a in range(len(handles)) for b in range(a + 1, len(handles))]
        return infos, pairs, nvml.driver(), nvml.cuda(), None
    except NvmlError as e:
        return [], [], None, None, str(e)
    finally:
        nvml.close()


# ---------------------------------------------------------------- Python packages
# Imported in a child process: a package that segfaults or hangs on import cannot take the probe down.
IMPORT_SCRIPT = r"""
import json, sys
def out(k, v): print(json.dumps([k, v]), flush=True)
for name in sys.argv[1:]:
    if name.startswith("meta:"):  # version only, without the cost of importing it
        import importlib.metadata as md
        try:
            out(name[5:], md.version(name[5:]))
        except Exception:
            pass
        continue
    try:
        mod = __import__(name)
    except BaseException as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        out("error:" + name, type(e).__name__ + ": " + msg)
        continue
    out(name, getattr(mod, "__version__", "unknown"))
    if name == "torch":
        out("torch_cuda", mod.version.cuda or "")
        out("torch_cxx11_abi", str(bool(getattr(mod._C, "_GLIBCXX_USE_CXX11_ABI", False))).upper())
        try:
            if mod.version.cuda:
                out("nccl", ".".join(map(str, mod.cuda.nccl.version())))
        except Exception:
            pass
"""


def _torch_without_import(spec):
    """torch version and CUDA from torch/version.py, NCCL from the nvidia-nccl wheel: no 1 s import."""
    import ast
    import importlib.metadata as md
    out = {}
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, TypeError):
        return out
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        name = getattr(target, "id", None)
        value = getattr(node, "value", None)
        if name in ("__version__", "cuda") and isinstance(value, ast.Constant):
            out["torch" if name == "__version__" else "torch_cuda"] = value.value or ""
    out.setdefault("torch_cuda", "")
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            out["nccl"] = md.version(dist)
            break
        except md.PackageNotFoundError:
            continue
    return out


def packages(python, timeout, deep=False):
    """(versions, import_errors) for torch, flash_attn, verl, ray in the given interpreter.

    flash-attn is imported (with torch before it: the ABI failures live there). Without flash-attn, torch's
    facts are read from its files unless deep=True; verl is imported only with deep=True (~3 s of CPU: too
    much for every node of every check); ray's version comes from its metadata."""
    import importlib.util
    versions, errors = {}, {}
    here = os.path.realpath(python) == os.path.realpath(sys.executable)
    installed = {n: (importlib.util.find_spec(n) if here else True) for n in ("torch", "flash_attn", "verl", "ray")}
    wanted = []
    for name, spec in installed.items():
        if spec is None:
            continue  # not installed: skip the slow import
        if name == "torch" and here and not deep and not installed["flash_attn"]:
            versions.update(_torch_without_import(spec))
            if "torch" in versions:
                continue
        wanted.append("meta:" + name if name == "ray" or (name == "verl" and not deep) else name)
    if not wanted:
        return versions, errors
    try:
        p = subprocess.run([python, "-c", IMPORT_SCRIPT, *wanted], capture_output=True, text=True,
                           timeout=timeout)
        lines = p.stdout.splitlines()
    except subprocess.TimeoutExpired as e:
        lines = (e.stdout or b"").decode(errors="replace").splitlines() if isinstance(e.stdout, bytes) \
            else (e.stdout or "").splitlines()
        errors["import"] = f"importing {', '.join(wanted)} took over {timeout:.0f}s"
    except OSError as e:
        return versions, {"import": str(e)}
    for line in lines:
        try:
            k, v = json.loads(line)
        except ValueError:
            continue
        if k.startswith("error:"):
            if not v.startswith("ModuleNotFoundError"):
                errors[k[6:]] = v
        else:
            versions[k] = v
    return versions, errors


# ---------------------------------------------------------------- system
def meminfo():
    vals = {}
    for line in _read("/proc/meminfo").splitlines():
        k, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            vals[k] = int(parts[0]) // 1024
    return vals.get("MemTotal"), vals.get("SwapTotal")


def cpu_info():
    """The CPU as /proc/cpuinfo names its first core. A VM's model name can be bare ("Intel(R) Xeon(R) Processor"):
    the model number and the clocks still tell hosts apart, and host_python_ms tells their speed."""
    info = {}
    for ln in _read("/proc/cpuinfo").splitlines():
        k, _, v = ln.partition(":")
        info.setdefault(k.strip(), v.strip())
    return {"model": info.get("model name", "unknown"), "model_number": info.get("model"),
            "mhz": info.get("cpu MHz"), "bogomips": info.get("bogomips"), "cores": os.cpu_count()}


def _python_work(n=200_000):
    """A fixed piece of interpreter work (dict lookups, float arithmetic, a loop): what verl's host side is made of
    between kernel launches. Its result is returned so nothing is optimized away."""
    d = {}
    acc = 0.0
    for i in range(n):
        k = i & 1023
        d[k] = d.get(k, 0) + i
        acc += (i * 0.5) % 7
    return acc + len(d)


def cpu_ticks():
    """(ticks wanted, steal ticks) of /proc/stat's all-CPU line, or None off Linux. Steal is the time the hypervisor
    gave this VM's runnable CPUs to someone else, so it is counted against the time its CPUs wanted to run (user,
    nice, system, irq, softirq and steal itself; guest is inside user), not their idle time: a one-thread probe on
    an idle 96-CPU VM would otherwise read a stolen third as 0.3%."""
    parts = _read("/proc/stat").split("\n", 1)[0].split()
    if len(parts) < 9 or parts[0] != "cpu" or not all(p.isdigit() for p in parts[1:9]):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(p) for p in parts[1:9])
    return user + nice + system + irq + softirq + steal, steal


def steal_pct(before, after):
    """The share of the CPUs' wanted time that was stolen between two cpu_ticks() readings, in %; None when either
    is missing or no tick passed."""
    if not before or not after or after[0] <= before[0]:
        return None
    return round(100.0 * (after[1] - before[1]) / (after[0] - before[0]), 1)


def host_speed():
    """host_python_ms and the CPU steal while it ran: a slow figure with steal is a shared VM's neighbours, one
    without it the host itself."""
    before = cpu_ticks()
    ms = host_python_ms()
    return ms, steal_pct(before, cpu_ticks())


def host_python_ms(repeats=7, clock=time.perf_counter):
    """The fastest of REPEATS runs of _python_work, in ms: this Python on this host's CPU. Hosts with the same CPU
    model name have run verl's host-bound phases ~1.4x apart (docs/placement.md, "Batch V"); the fastest run is the
    figure least moved by a neighbour's load."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        t = clock()
        _python_work()
        best = min(best, clock() - t)
    return round(best * 1e3, 2)


def collect(head_ip=None, python=None, import_timeout=60.0, deep=False):
    ifaces = interfaces()
    dev, src = route_to(head_ip, ifaces) if head_ip else (None, None)
    rdma_devices, rdma_ports = rdma()
    ucx_version, ucx_transports = ucx()
    gpu_list, pairs, driver, cuda, nvml_error = gpus()
    versions, import_errors = packages(python or sys.executable, import_timeout, deep)
    mem, swap = meminfo()
    speed_ms, steal = host_speed()
    return {
        "host": socket.gethostname(),
        "hostname": socket.gethostname(),
        "interfaces": ifaces,
        "route_to_head": dev,
        "route_source": src,
        "rdma_devices": rdma_devices,
        "rdma_active_ports": rdma_ports,
        "ucx_version": ucx_version,
        "ucx_transports": ucx_transports,
        "gpus": gpu_list,
        "gpu_pairs": pairs,
        "driver_version": driver,
        "cuda_version": cuda,
        "python_version": platform.python_version(),
        "python_executable": python or sys.executable,
        "versions": versions,
        "import_errors": import_errors,
        "ulimit_nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "mem_total_mib": mem,
        "swap_total_mib": swap,
        "cpu_count": os.cpu_count(),
        "host_python_ms": speed_ms,
        "host_steal_pct": steal,
        "nvml_error": nvml_error,
        # what Ray started from the same environment would be limited to (Slurm sets it in GPU job steps)
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "probe_time": time.time(),
    }


if __name__ == "__main__":
    head = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None
    print(MARK + json.dumps(collect(head, deep="--deep" in sys.argv)), flush=True)
