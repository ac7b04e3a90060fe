"""Long lines written in many small flushed pieces, on stdout and stderr at once (bpslaunch's
output test, tests/test_launcher_cli.py): line I of rank R is ``BEGIN R I `` + 200 pieces of
100 characters + `` END R I``; a reader must see each whole, behind one tag."""
import os
import sys
import time

import byteps.numpy as bps

bps.init()              # a whole job: its scheduler and server end with the workers
rank = os.environ["RANK"]
for i in range(3):
    for stream in (sys.stdout, sys.stderr):
        stream.write(f"BEGIN {rank} {i} ")
        for _ in range(200):
            stream.write(rank * 100)
            stream.flush()
            time.sleep(0.0002)
        stream.write(f" END {rank} {i}\n")
        stream.flush()
bps.shutdown()
