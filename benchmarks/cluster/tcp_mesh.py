"""Raw TCP in the parameter-server pattern: every worker host sends to and receives from
every server host at once (full duplex), the physical limit of a PS job's links.

    tcp_mesh.py serve PORT NCONN SECONDS        # a server host: accept NCONN connections
    tcp_mesh.py connect SECONDS HOST:PORT ...    # a worker host: one connection per server

Each host prints ``CLUSTER_RESULT {json}`` with its total bytes per second each way
(over all its connections), measured while every connection is still busy.
"""
import json
import socket
import sys
import threading
import time

from tcp_probe import drain, pump


def run(conns: list, seconds: float, role: str) -> None:
    results = [dict() for _ in conns]
    threads = []
    cpu0 = time.process_time()          # this process's CPU while the mesh runs (the floor)
    for c, r in zip(conns, results):
        threads.append(threading.Thread(target=drain, args=(c, r)))
        threads.append(threading.Thread(target=pump, args=(c, seconds, r)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    sent = sum(r.get("sent", 0) for r in results)
    got = sum(r.get("received", 0) for r in results)
    cpu = time.process_time() - cpu0
    span = max((r.get("recv_s") or 0.0) for r in results) or seconds
    print("CLUSTER_RESULT " + json.dumps({"role": role, "conns": len(conns),
                                          "send_Bps": sent / seconds, "recv_Bps": got / span,
                                          "cpu_s": cpu, "moved_bytes": sent + got}),
          flush=True)


def main() -> None:
    if sys.argv[1] == "serve":
        port, n, seconds = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", port))
        srv.listen(n)
        srv.settimeout(60)
        conns = [srv.accept()[0] for _ in range(n)]
        for c in conns:
            c.settimeout(None)
        run(conns, seconds, "serve")
    else:
        seconds, conns = float(sys.argv[2]), []
        for hp in sys.argv[3:]:
            host, port = hp.rsplit(":", 1)
            deadline = time.monotonic() + 30
            while True:
                try:
                    conns.append(socket.create_connection((host, int(port)), timeout=5))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        for c in conns:
            c.settimeout(None)
        run(conns, seconds, "connect")


if __name__ == "__main__":
    main()
