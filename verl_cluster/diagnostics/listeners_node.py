"""Node-side: the TCP ports some processes listen on, with the address each is bound to, and whether it answers
a client that holds no token. Shipped as source (`python -c SOURCE PIDS DASHBOARD_PORT`); stdlib, plus grpc where
Ray brought it. PIDS: comma-separated (our Ray's processes, from node_script's probe).

An HTTP port is asked `GET` without credentials: 401/403 is a refusal, any other status an answer. A port that
does not speak HTTP/1 is taken for gRPC and asked a read-only method of each of Ray's services without the token
until one is served: UNAUTHENTICATED is a refusal; a reply (or an error about the request) is an answer.
"""

import json
import os
import socket
import sys
import threading

MARK = "@@VC-JSON@@"
# read-only (or empty) calls, one per Ray gRPC service; a server that does not serve one says UNIMPLEMENTED
GRPC_METHODS = ("/ray.rpc.NodeInfoGcsService/GetAllNodeInfo", "/ray.rpc.NodeManagerService/GetSystemConfig",
                "/ray.rpc.CoreWorkerService/NumPendingTasks", "/ray.rpc.LogService/ListLogs",
                "/ray.rpc.RayletDriver/ClusterInfo")  # not ObjectManagerService: it has only Push and Pull


def _addr(hexaddr):
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listening():
    """socket inode -> (address, port) of every listening TCP socket in this network namespace."""
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "0A":  # LISTEN
                a, p = f[1].split(":")
                out[f[9]] = (_addr(a), int(p, 16))
    return out


def owners(pids):
    """socket inode -> (pid, process name) for the given processes."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        module = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"), None)
        name = module or next((w.rsplit("/", 1)[-1] for w in words if w.endswith(".py")), None) or \
            (words[0].rsplit("/", 1)[-1] if words else "?")
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.setdefault(link[8:-1], (pid, name[:40]))
    return out


def _target(addr):
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(addr, addr)


def http_probe(addr, port, path, timeout=2.0):
    """HTTP status for GET path without credentials, or None when the port does not speak HTTP/1."""
    try:
        with socket.create_connection((_target(addr), port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\nHost: probe\r\n\r\n".encode())
            data = s.recv(64)
    except OSError:
        return None
    if data.startswith(b"HTTP/1."):
        try:
            return int(data.split()[1])
        except (IndexError, ValueError):
            return None
    return None


def grpc_probe(addr, port, timeout=2.0):
    try:
        import grpc
    except ImportError:
        return "grpc not importable here"
    host = _target(addr)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    channel = grpc.insecure_channel(target)
    try:
        for method in GRPC_METHODS:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                call(b"", timeout=timeout)
                return f"answers ({method.rsplit('/', 1)[-1]})"
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    continue
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    return "refused (gRPC UNAUTHENTICATED)"
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return f"no answer (gRPC {code.name})"
                return f"answers ({method.rsplit('/', 1)[-1]}: gRPC {code.name})"
        return "not asked (gRPC; no read-only method of its service is known)"
    finally:
        channel.close()


def probe(addr, port, dashboard_port):
    code = http_probe(addr, port, "/api/jobs/" if port == dashboard_port else "/metrics")
    if code is not None:
        refused = code in (401, 403)
        return ("refused" if refused else "answers") + f" (HTTP {code})", "http", not refused
    verdict = grpc_probe(addr, port)
    return verdict, "grpc", verdict.startswith("answers")


def main(pids, dashboard_port="0"):
    socks = listening()
    own = owners([int(p) for p in pids.split(",") if p.strip().isdigit()])
    rows = [{"address": socks[i][0], "port": socks[i][1], "pid": own[i][0], "process": own[i][1]}
            for i in own if i in socks]
    rows.sort(key=lambda r: (r["port"], r["address"]))

    def one(r):
        r["answer"], r["protocol"], r["open_without_token"] = probe(r["address"], r["port"], int(dashboard_port))

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in rows[:256]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    print(MARK + json.dumps({"listeners": rows}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
