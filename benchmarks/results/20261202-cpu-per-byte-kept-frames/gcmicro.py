"""Process CPU per pushed message: a fresh zero-copy send of the same array (pyzmq gc
registration + gc thread wake-up per send) against a kept Frame (SentFrames)."""
import sys, time, threading, statistics
import numpy as np, zmq
sys.path.insert(0, "/work/main")
from byteps import transport
from byteps.transport.frames import SentFrames
ctx = zmq.Context()
r = ctx.socket(zmq.ROUTER); port = r.bind_to_random_port("tcp://127.0.0.1")
d = ctx.socket(zmq.DEALER); d.connect(f"tcp://127.0.0.1:{port}")
def run(nbytes, kept, n):
    a = np.ones(nbytes // 4, np.float32)
    sf = SentFrames()
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        transport.send_frames(d, [b"hdr", sf.get("k", a) if kept else a])
        transport.recv_frames(r)
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6
for nbytes, n in ((262144, 4000), (1 << 20, 1500)):
    res = {False: [], True: []}
    for rep in range(5):
        for kept in (False, True):
            res[kept].append(run(nbytes, kept, n)[0])
    print(f"{nbytes >> 10} KB: process CPU per message, fresh send {statistics.median(res[False]):.1f} us "
          f"(all {[round(x) for x in res[False]]}), kept frame {statistics.median(res[True]):.1f} us "
          f"(all {[round(x) for x in res[True]]})", flush=True)
