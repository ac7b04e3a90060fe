"""byteps/common/malloc.py: with the tuning, freed message-sized buffers are reused from the
heap instead of being page-faulted in again (what ZeroMQ's receive buffers go through), and so
are blocks over the mmap threshold (a large layer's gradient, allocated every step)."""
import subprocess
import sys

import pytest

# the tuning, as a worker applies it, and libc's malloc, free and memset
LIBC = r'''
import ctypes, resource, sys, threading
from byteps.common import malloc
on = sys.argv[1] == "1"
print("tuned", malloc.tune(on))
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
'''

SCRIPT = LIBC + r'''
faults = []
def run():           # a thread arena, like ZeroMQ's I/O thread: 8 partitions of 1 MB in flight
    for rnd in range(40):
        if rnd == 5:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        bufs = [libc.malloc(1 << 20) for _ in range(8)]
        for b in bufs:
            libc.memset(b, 1, 1 << 20)
        for b in bufs:
            libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
t = threading.Thread(target=run); t.start(); t.join()
print("faults", faults[1] - faults[0])
'''


def _faults(on: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, on], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    return out[1] == "True", int(out[3])


def test_tuned_buffers_are_not_faulted_in_again():
    tuned, faults = _faults("1")
    if not tuned:
        pytest.skip("no glibc mallopt here")
    untuned_flag, untuned = _faults("0")
    assert not untuned_flag
    # 35 rounds x 8 MB: with glibc's defaults the arena's top is given back and every round
    # faults its 2048 pages in again; tuned, the memory stays (a few stray faults at most)
    assert untuned > 35 * 1000, untuned
    assert faults < 500, faults


BIG = LIBC + r'''
faults = []
def run():    # a 67 MB and a 50 MB gradient, allocated again every step (torch's zero_grad)
    for step in range(12):
        if step == 2:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        bufs = [libc.malloc(n << 20) for n in (67, 50)]
        for b, n in zip(bufs, (67, 50)):
            libc.memset(b, 1, n << 20)
        for b in bufs:
            libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
run()             # in the main thread, as autograd runs a CPU backward pass
print("faults", faults[1] - faults[0])
'''


def test_blocks_over_the_mmap_threshold_stay_in_the_heap_too():
    out = subprocess.run([sys.executable, "-c", BIG, "1"], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    if out[1] != "True":
        pytest.skip("no glibc mallopt here")
    untuned = subprocess.run([sys.executable, "-c", BIG, "0"], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
    # 10 steps x 117 MB: mmap-ed, every step faults its ~30,000 pages in again; tuned, the
    # heap keeps them (a thread's arena, at most 64 MB per heap, still maps larger blocks)
    assert int(untuned[3]) > 10 * 25_000, untuned
    assert int(out[3]) < 1000, out
