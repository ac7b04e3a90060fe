"""Steps of a job that marks none (``step_done()`` never called: a numpy or JAX loop
calling push_pull): a step ends when a name is pushed again since the last step ended,
just before that push, if none of the loop's own push_pulls is in flight then (every
handle synchronized: a clean point between two steps, the same on every rank running the
same program; a name pushed again while operations are pending, e.g. twice in flight,
ends no step).  Other threads' operations do not count: autotune's own exchange from the
last step end completes once the slowest rank has pushed it, so whether it is still in
flight at the next step's first push differs from rank to rank (counted, it let one rank
skip a step end that the others took: their exchanges then waited for each other;
``timeline.StepCounter.busy``).  Autotune hears of a step end (and runs its exchanges
there, which every rank must reach) only once the loop is steady: the step that ended
pushed the same names in the same order as the one before it.  A program whose ranks
push a name at different points (e.g. one rank before a barrier, the others after it)
thus never reaches an exchange it could wait in forever (docs/scaling.md, "Autotune").

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
        self.cur: list = []         # the names of the current step, in order
        self.prev: list | None = None
        self.count = 0              # steady step ends reported
        self.lock = threading.Lock()

    def pushed(self, name: str, idle: bool = True) -> bool:
        """A synchronous push_pull of ``name`` is about to start, ``idle``: none of the
        loop's own push_pulls is in flight (``StepCounter.busy``).  True when it ends a
        step (the caller then runs autotune's boundary before pushing it)."""
        if self.explicit or name.startswith(OWN) or \
                threading.current_thread() is not threading.main_thread():
            return False
        with self.lock:
            if name not in self.seen or not idle:
                self.seen.add(name)
                self.cur.append(name)
                return False
            steady = self.cur == self.prev
            self.prev, self.cur, self.seen = self.cur, [name], {name}
            self.count += steady
            return steady
