"""The two table layouts the benchmarks print: a Markdown table (results folders' tables.md,
docs) and a right-aligned fixed-width text table (terminal output and ``.txt`` files).
Callers format each cell; these only lay the cells out."""
from __future__ import annotations

from typing import Iterable, Sequence


def markdown(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """``| a | b |`` lines: the header, the ``|---|`` rule, one line per row of cells."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def fixed(cols: Sequence[tuple[str, int, str]], rows: Iterable[Sequence]) -> str:
    """Right-aligned columns one space apart: ``cols`` are ``(title, width, spec)``, where
    ``spec`` formats the column's values (``".2f"``; ``""``: as they are); ``rows`` hold
    the values in column order."""
    lines = [" ".join(f"{t:>{w}}" for t, w, _ in cols)]
    lines += [" ".join(f"{v:>{w}{spec}}" for v, (_, w, spec) in zip(r, cols)) for r in rows]
    return "\n".join(lines)
