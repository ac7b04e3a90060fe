"""Raw TCP throughput between emulated hosts: the physical limit of a link.

    tcp_probe.py serve PORT SECONDS          # receive (and send back) for SECONDS
    tcp_probe.py send HOST PORT SECONDS      # send (and receive) for SECONDS

Both sides send and receive at once (full duplex, like a PS worker's link)
and print ``CLUSTER_RESULT {json}`` with the bytes per second each way.
"""
import json
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def pump(sock: socket.socket, seconds: float, result: dict) -> None:
    buf = memoryview(bytearray(CHUNK))
    stop = time.monotonic() + seconds
    sent = 0
    try:
        while time.monotonic() < stop:
            sent += sock.send(buf)
    except OSError:
        pass
    result["sent"], result["send_s"] = sent, seconds
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def drain(sock: socket.socket, result: dict) -> None:
    buf = bytearray(CHUNK)
    got, t0, last = 0, None, None
    while True:
        n = sock.recv_into(buf)
        if not n:
            break
        now = time.monotonic()
        t0 = t0 or now
        last = now
        got += n
    result["received"] = got
    result["recv_s"] = (last - t0) if t0 and last and last > t0 else 0.0


def duplex(sock: socket.socket, seconds: float, role: str) -> None:
    res: dict = {}
    th = threading.Thread(target=drain, args=(sock, res))
    th.start()
    pump(sock, seconds, res)
    th.join(seconds + 30)
    res.update(role=role, send_Bps=res["sent"] / seconds,
               recv_Bps=res["received"] / res["recv_s"] if res.get("recv_s") else 0.0)
    print("CLUSTER_RESULT " + json.dumps(res), flush=True)


def main() -> None:
    if sys.argv[1] == "serve":
        port, seconds = int(sys.argv[2]), float(sys.argv[3])
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", port))
        srv.listen(1)
        srv.settimeout(60)
        conn, _ = srv.accept()
        duplex(conn, seconds, "serve")
    else:
        host, port, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        deadline = time.monotonic() + 30
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        sock.settimeout(None)
        duplex(sock, seconds, "send")


if __name__ == "__main__":
    main()
