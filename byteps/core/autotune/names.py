"""Steps of a job that marks none (``step_done()`` never called: a numpy or JAX loop
calling push_pull): a step ends when a name is pushed again since the last step ended,
just before that push (docs/scaling.md, "Autotune").

The same rule on every rank: every synchronous push_pull is pushed by every rank, so each
rank sees the same names per step (in any order) and ends its steps at the same pushes;
autotune's exchanges at these boundaries line up as with marked steps.  Only the main
thread's pushes count (the user's loop, in program order): a background stage's
(AsyncModelAverage's, DiLoCo's fragments) run at times that differ from rank to rank.
Autotune's own push_pulls (``byteps.autotune.*``) and asynchronous pushes do not count
either; the first explicit ``step_done()`` ends the inference for good (the marks are the
steps from then on).  Not in elastic jobs (a newcomer's names start afresh).
"""
from __future__ import annotations

import threading

OWN = "byteps.autotune."          # autotune's own tensors (autotune.NAME + ".")


class NameSteps:
    """The step boundaries of a job that marks none: a step ends when a name repeats."""

    def __init__(self):
        self.explicit = False       # a step_done() was seen: the marks are the steps
        self.seen: set = set()
        self.count = 0              # steps ended by a repeated name
        self.lock = threading.Lock()

    def pushed(self, name: str) -> bool:
        """A synchronous push_pull of ``name`` is about to start: True when it ends a step
        (the caller then runs autotune's boundary before pushing it)."""
        if self.explicit or name.startswith(OWN) or \
                threading.current_thread() is not threading.main_thread():
            return False
        with self.lock:
            if name not in self.seen:
                self.seen.add(name)
                return False
            self.seen = {name}
            self.count += 1
            return True
