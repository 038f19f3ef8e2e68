"""NVML through ctypes: the one GPU reader of the node-side scripts (diagnostics/probe_node.py,
nodes/node_script.py). STDLIB ONLY, no imports from this package: it is shipped as source in front of those
scripts (runners.remote_python.script_source) and needs nothing on a node but the NVIDIA driver.
"""

import ctypes

NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_ANCESTOR = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
# nvmlReturn_t 1..30, named as nvidia-ml-py names its exceptions (NVMLError_<Name>)
NVML_ERROR_NAMES = (
    "Uninitialized InvalidArgument NotSupported NoPermission AlreadyInitialized NotFound InsufficientSize "
    "InsufficientPower DriverNotLoaded Timeout IrqIssue LibraryNotFound FunctionNotFound CorruptedInforom GpuIsLost "
    "ResetRequired OperatingSystem LibRmVersionMismatch InUse Memory NoData VgpuEccNotSupported "
    "InsufficientResources FreqNotSupported ArgumentVersionMismatch Deprecated NotReady GpuNotFound "
    "InvalidState").split()
NVML_INSUFFICIENT_SIZE = 7
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1  # usedGpuMemory where the driver cannot say


class NvmlError(RuntimeError):
    def __init__(self, rc, text):
        super().__init__(f"NVML error {rc}: {text}")
        self.rc, self.text = rc, text

    def named(self):
        """'NVMLError_GpuIsLost: GPU is lost', as nvidia-ml-py words it."""
        name = NVML_ERROR_NAMES[self.rc - 1] if 0 < self.rc <= len(NVML_ERROR_NAMES) else "Unknown"
        return f"NVMLError_{name}: {self.text}"


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Process(ctypes.Structure):  # nvmlProcessInfo_v2_t (the _v2 and _v3 calls)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


def load_library():
    return ctypes.CDLL(NVML_LIBRARY)


class Nvml:
    """An initialised NVML; close() when done."""

    def __init__(self, lib=None):
        self.lib = lib if lib is not None else load_library()
        self._check(self.lib.nvmlInit_v2())

    def _check(self, rc):
        if rc != 0:
            self.lib.nvmlErrorString.restype = ctypes.c_char_p
            raise NvmlError(rc, self.lib.nvmlErrorString(rc).decode())

    def _str(self, fn, *args, size=96):
        buf = ctypes.create_string_buffer(size)
        self._check(fn(*args, buf, ctypes.c_uint(size)))
        return buf.value.decode()

    def _int(self, fn, *args, ctype=ctypes.c_int):
        v = ctype()
        self._check(fn(*args, ctypes.byref(v)))
        return v.value

    def close(self):
        try:
            self.lib.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort
            pass

    def count(self):
        return self._int(self.lib.nvmlDeviceGetCount_v2, ctype=ctypes.c_uint)

    def handle(self, i):
        h = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(h)))
        return h

    def driver(self):
        return self._str(self.lib.nvmlSystemGetDriverVersion, size=80)

    def cuda(self):
        v = self._int(self.lib.nvmlSystemGetCudaDriverVersion)
        return f"{v // 1000}.{v % 1000 // 10}"

    def name(self, h):
        return self._str(self.lib.nvmlDeviceGetName, h)

    def memory(self, h):
        """(total, free) bytes."""
        mem = _Memory()
        self._check(self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)))
        return mem.total, mem.free

    def ecc_uncorrected(self, h, volatile):
        """Uncorrected ECC errors since the driver loaded (volatile) or over the GPU's life; None where the GPU
        has no ECC (NOT_SUPPORTED)."""
        ecc = ctypes.c_ulonglong()
        rc = self.lib.nvmlDeviceGetTotalEccErrors(h, ctypes.c_int(1), ctypes.c_int(0 if volatile else 1),
                                                  ctypes.byref(ecc))
        return ecc.value if rc == 0 else None

    def compute_processes(self, h):
        """[(pid, used bytes or None)] of the compute processes on the GPU."""
        fn = getattr(self.lib, "nvmlDeviceGetComputeRunningProcesses_v3", None) or \
            self.lib.nvmlDeviceGetComputeRunningProcesses_v2
        count = ctypes.c_uint(0)
        rc = fn(h, ctypes.byref(count), None)
        if rc == 0:
            return []
        if rc != NVML_INSUFFICIENT_SIZE:
            self._check(rc)
        count.value = count.value * 2 + 5  # room for processes started since
        procs = (_Process * count.value)()
        self._check(fn(h, ctypes.byref(count), procs))
        return [(p.pid, None if p.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE else p.usedGpuMemory)
                for p in procs[:count.value]]

    def gpu(self, i, h):
        total, free = self.memory(h)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(major), ctypes.byref(minor)))
        links = 0
        for link in range(18):  # NVML_NVLINK_MAX_LINKS
            state = ctypes.c_int()
            if self.lib.nvmlDeviceGetNvLinkState(h, ctypes.c_uint(link), ctypes.byref(state)) == 0 and state.value:
                links += 1
        nproc = ctypes.c_uint(0)
        prc = self.lib.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(nproc), None)
        return {"index": i, "name": self.name(h),
                "memory_total_mib": total // 2**20, "memory_free_mib": free // 2**20,
                "compute_capability": f"{major.value}.{minor.value}",
                "uuid": self._str(self.lib.nvmlDeviceGetUUID, h),
                "nvlink_links_active": links,
                "ecc_errors_uncorrected": self.ecc_uncorrected(h, volatile=False),
                "processes": nproc.value if prc in (0, 7) else 0}  # 7: INSUFFICIENT_SIZE, count is set

    def pair(self, a, ha, b, hb):
        anc = ctypes.c_int(-1)
        self.lib.nvmlDeviceGetTopologyCommonAncestor(ha, hb, ctypes.byref(anc))
        status = ctypes.c_int(-1)
        p2p = self.lib.nvmlDeviceGetP2PStatus(ha, hb, ctypes.c_int(0), ctypes.byref(status)) == 0 \
            and status.value == 0  # index 0: READ; status 0: OK
        nvl = ctypes.c_int(-1)
        nvlink = self.lib.nvmlDeviceGetP2PStatus(ha, hb, ctypes.c_int(3), ctypes.byref(nvl)) == 0 \
            and nvl.value == 0  # index 3: NVLINK
        return {"a": a, "b": b, "common_ancestor": NVML_ANCESTOR.get(anc.value, "unknown"),
                "p2p": bool(p2p), "nvlink": bool(nvlink)}


def open_nvml():
    """(Nvml, None), or (None, why) when there is no driver or NVML does not start."""
    try:
        return Nvml(), None
    except OSError:
        return None, "no NVIDIA driver (libnvidia-ml.so.1 not found)"
    except NvmlError as e:
        return None, f"NVML init failed: {e}"
