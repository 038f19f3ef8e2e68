"""libnvidia-ml answering as a recorded GPU machine did (tests/fixtures/facts/*.json, recorded by
scripts/calibration/record_facts.py): the C functions facts/nvml_node.py calls through ctypes, writing through the same
pointers. NVML cannot exist on this CPU machine; faults are injected by changing `lost` / `ecc` / `count`."""

import ctypes

NAMES = {15: b"GPU is lost", 12: b"NVML Shared Library Not Found", 3: b"Not Supported"}


def _out(ref):
    return ref._obj  # the ctypes object a byref() points at


class ReplayedNvml:
    def __init__(self, facts: dict, procs: dict | None = None):
        self.facts, self.gpus = facts, facts["gpus"]
        self.count = len(self.gpus)
        self.lost: set[int] = set()
        self.ecc: dict[int, int] = {}  # volatile uncorrected errors injected per GPU
        self.procs = procs or {}  # GPU index -> [(pid, used bytes)]
        self.nvmlErrorString = self._error_string

    @staticmethod
    def _error_string(rc):
        return NAMES.get(rc, b"Unknown Error")

    def _gpu(self, h):
        return self.gpus[self._i(h)]

    @staticmethod
    def _i(h):
        return h.value - 1  # handles are index + 1 (a NULL handle would read as None)

    def nvmlInit_v2(self):
        return 0

    def nvmlShutdown(self):
        return 0

    def nvmlDeviceGetCount_v2(self, n):
        _out(n).value = self.count
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, i, h):
        _out(h).value = i.value + 1
        return 0

    def nvmlSystemGetDriverVersion(self, buf, size):
        buf.value = self.facts["driver_version"].encode()
        return 0

    def nvmlSystemGetCudaDriverVersion(self, v):
        major, minor = self.facts["cuda_version"].split(".")
        _out(v).value = int(major) * 1000 + int(minor) * 10
        return 0

    def nvmlDeviceGetName(self, h, buf, size):
        buf.value = self._gpu(h)["name"].encode()
        return 0

    def nvmlDeviceGetUUID(self, h, buf, size):
        buf.value = self._gpu(h)["uuid"].encode()
        return 0

    def nvmlDeviceGetMemoryInfo(self, h, mem):
        if self._i(h) in self.lost:
            return 15
        g = self._gpu(h)
        m = _out(mem)
        m.total, m.free = g["memory_total_mib"] << 20, g["memory_free_mib"] << 20
        m.used = m.total - m.free
        return 0

    def nvmlDeviceGetCudaComputeCapability(self, h, major, minor):
        _out(major).value, _out(minor).value = map(int, self._gpu(h)["compute_capability"].split("."))
        return 0

    def nvmlDeviceGetNvLinkState(self, h, link, state):
        _out(state).value = int(link.value < self._gpu(h)["nvlink_links_active"])
        return 0

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter, out):
        if counter.value == 0:  # volatile: since the driver loaded
            _out(out).value = self.ecc.get(self._i(h), 0)
        else:
            _out(out).value = self._gpu(h)["ecc_errors_uncorrected"]
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, h, n, array):
        _out(n).value = self._gpu(h)["processes"]
        return 7 if _out(n).value else 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h, n, array):
        procs = self.procs.get(self._i(h), [])
        if array is None:
            _out(n).value = len(procs)
            return 7 if procs else 0
        for k, (pid, used) in enumerate(procs):
            array[k].pid, array[k].usedGpuMemory = pid, used
        _out(n).value = len(procs)
        return 0

    def nvmlDeviceGetTopologyCommonAncestor(self, ha, hb, out):
        pair = self._pair(ha, hb)
        _out(out).value = {"internal": 0, "single": 10, "multiple": 20, "hostbridge": 30, "node": 40,
                           "system": 50}[pair["common_ancestor"]]
        return 0

    def nvmlDeviceGetP2PStatus(self, ha, hb, index, out):
        pair = self._pair(ha, hb)
        _out(out).value = 0 if pair["nvlink" if index.value == 3 else "p2p"] else 1
        return 0

    def _pair(self, ha, hb):
        a, b = sorted((self._i(ha), self._i(hb)))
        return next(p for p in self.facts["gpu_pairs"] if (p["a"], p["b"]) == (a, b))
