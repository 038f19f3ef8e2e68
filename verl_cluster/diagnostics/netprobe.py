"""Node-side network helper. STDLIB ONLY: shipped as source and run with the node's Python.

    serve PORTS PERF_CANDIDATES SECONDS   bind every free port in PORTS (short-lived listeners for the port
                                          matrix; a port already bound, e.g. by a live Ray, is reported as
                                          in use), plus one perf server on the first free candidate port;
                                          prints one ready line, then serves until stopped or SECONDS pass
    probe TARGETS TIMEOUT                 TARGETS: "ip:port,ip:port"; TCP connect to each in parallel
    perf IP PORT SECONDS PINGS            round-trip latency (1-byte ping-pong) and a TCP stream to a perf server

Ports lists are comma-separated. Output: one JSON line after MARK.
"""

import json
import select
import socket
import sys
import threading
import time

MARK = "@@VC-JSON@@"
CHUNK = 4 * 1024 * 1024


def emit(data):
    print(MARK + json.dumps(data), flush=True)


def _listener(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        s.listen(128)
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s


def _perf_conn(conn):
    """One perf client: 'P' = echo bytes back (latency), 'S' = count bytes until EOF, reply the count."""
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode = conn.recv(1)
        if mode == b"P":
            while True:
                b = conn.recv(64)
                if not b:
                    break
                conn.sendall(b)
        elif mode == b"S":
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            total = 0
            while True:
                n = conn.recv_into(view)
                if not n:
                    break
                total += n
            conn.sendall(total.to_bytes(8, "big"))
    except OSError:
        pass
    finally:
        conn.close()


def serve(ports, candidates, seconds):
    socks, in_use = {}, []
    for p in ports:
        s = _listener(p)
        if s is None:
            in_use.append(p)
        else:
            socks[s] = p
    perf, perf_port = None, None
    for p in candidates:
        if p in ports:
            continue
        perf = _listener(p)
        if perf is not None:
            perf_port = p
            break
    emit({"bound": sorted(socks.values()), "in_use": in_use, "perf_port": perf_port})
    deadline = time.monotonic() + seconds
    watch = list(socks) + ([perf] if perf else [])
    while time.monotonic() < deadline:  # the caller stops us earlier when done; this bounds a lost caller
        r, _, _ = select.select(watch, [], [], 0.5)
        for s in r:
            try:
                conn, _ = s.accept()
            except OSError:
                continue
            if s is perf:
                conn.setblocking(True)
                threading.Thread(target=_perf_conn, args=(conn,), daemon=True).start()
            else:
                conn.close()  # the port matrix only needs the handshake


def _connect(ip, port, timeout):
    t0 = time.monotonic()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((ip, port))
        return "open", (time.monotonic() - t0) * 1000
    except ConnectionRefusedError:
        return "refused", None
    except socket.timeout:
        return "timeout", None
    except OSError as e:
        return f"error: {e.strerror or e}", None
    finally:
        s.close()


def probe(targets, timeout):
    results = {}

    def one(t):
        ip, _, port = t.rpartition(":")
        results[t] = _connect(ip, int(port), timeout)

    threads = [threading.Thread(target=one, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 2)
    return {t: {"state": results.get(t, ("timeout", None))[0], "ms": results.get(t, (None, None))[1]}
            for t in targets}


def perf(ip, port, seconds, pings):
    out = {}
    with socket.create_connection((ip, port), timeout=5) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"P")
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            s.sendall(b"x")
            if not s.recv(64):
                break
            rtts.append((time.perf_counter() - t0) * 1000)
        rtts.sort()
        out["latency_ms"] = rtts[len(rtts) // 2] if rtts else None
    if seconds > 0:
        with socket.create_connection((ip, port), timeout=5) as s:
            s.settimeout(seconds + 30)
            s.sendall(b"S")
            data = memoryview(bytearray(CHUNK))
            sent = 0
            t0 = time.perf_counter()
            end = t0 + seconds
            while time.perf_counter() < end:
                s.sendall(data)
                sent += len(data)
            s.shutdown(socket.SHUT_WR)
            reply = b""
            while len(reply) < 8:
                b = s.recv(8 - len(reply))
                if not b:
                    break
                reply += b
            elapsed = time.perf_counter() - t0
            received = int.from_bytes(reply, "big") if len(reply) == 8 else 0
            out["bytes"] = received
            out["seconds"] = elapsed
            out["bandwidth_gbps"] = received * 8 / elapsed / 1e9 if elapsed > 0 else None
    return out


def _ports(text):
    return [int(p) for p in text.split(",") if p]


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "serve":
        serve(_ports(args[0]), _ports(args[1]), float(args[2]))
    elif mode == "probe":
        emit(probe([t for t in args[0].split(",") if t], float(args[1])))
    elif mode == "perf":
        emit(perf(args[0], int(args[1]), float(args[2]), int(args[3])))
    else:
        sys.exit(f"unknown mode {mode}")
