"""In-process: CPU per pushed partition of Server.on_worker (4 workers, 1 key, sync rounds),
replies sent to real DEALER sockets (drained), no network timing.  python srvmicro.py [kb] [rounds] [profile]"""
import sys, time, os
sys.path.insert(0, os.environ.get("TREE", "/work/main"))
import numpy as np, zmq
from byteps.common.config import Config
from byteps.server import Server
from byteps.transport import wire
from byteps.transport.wire import Entry, Op, PUSH, PULL, AVG
kb = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 300
env = {"DMLC_ROLE": "server", "DMLC_NUM_WORKER": "4", "DMLC_NUM_SERVER": "1",
       "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "1", "BYTEPS_JOB_SECRET": "x" * 32,
       "DMLC_NODE_HOST": "127.0.0.1"}
cfg = Config.from_env(env, role="server")
srv = Server(cfg)
srv.link.node_id, srv.link.epoch = 100, 0
W = 4
workers = [{"node_id": 10 + r, "rank": r, "host_id": f"h{r}", "local_rank": 0, "machine": "m"} for r in range(W)]
srv.load_book({"workers": workers})
ctx = zmq.Context()
deal = []
for r in range(W):
    d = ctx.socket(zmq.DEALER); d.setsockopt(zmq.IDENTITY, f"w{r}".encode()); d.setsockopt(zmq.RCVHWM, 0)
    d.connect(srv.address); deal.append(d)
secret = cfg.job_secret.encode()
seq = [1000] * W
def msg(r, op, body, payload=()):
    seq[r] += 1
    return [zmq.Frame(f"w{r}".encode())] + [zmq.Frame(f) for f in wire.encode(cfg.job_id, 10 + r, op, 0, seq[r], body, secret)] + [zmq.Frame(p) for p in payload]
for r in range(W):
    d = deal[r]; d.send(b"")  # make the connection known
time.sleep(0.3)
for r in range(W):
    srv.on_worker(msg(r, Op.HELLO, {}))
n = kb * 256
arr = [np.full(n, r + 1.0, np.float32) for r in range(W)]
decl = [[7, "g", [n], 0, 0, []]]
def drain():
    for d in deal:
        while d.poll(0):
            d.recv_multipart(copy=False)
def one_round(rnd, first=False):
    for r in range(W):
        m = msg(r, Op.DATA, [[list(Entry(7, 0, rnd, PUSH | PULL | AVG, 0, n))], decl if first else []], [arr[r]])
        with srv.replies.burst():
            srv.on_worker(m)
        srv.replies.flush()
    drain()
for rnd in range(5):
    one_round(rnd, rnd == 0)
if len(sys.argv) > 3:
    import cProfile, pstats
    pr = cProfile.Profile(time.thread_time); pr.enable()
    for rnd in range(5, 5 + rounds): one_round(rnd)
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(25)
else:
    best = []
    for rep in range(5):
        c0 = time.thread_time_ns()
        base = 5 + rep * rounds + (10**6 if False else 0)
        for rnd in range(5 + (rep + 1) * 100000, 5 + (rep + 1) * 100000 + rounds):
            one_round(rnd)
        best.append((time.thread_time_ns() - c0) / 1e3 / (rounds * W))
    print(f"{kb} KB, {W} workers: main-thread CPU per push (incl. its round's sum, reply, message build) "
          f"min {min(best):.1f} us, all {[round(b, 1) for b in best]}")
