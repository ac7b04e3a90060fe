"""The environment-variable part of ``bpslaunch --help``.

Names, defaults and meanings come from the table in :mod:`byteps.common.variables` (the
configuration's one source of them; its rows with ``help=True``), never copied here.
"""
from __future__ import annotations

from byteps.common import variables

# (variable, Config field or None, default as shown, meaning) of the variables --help lists
VARIABLES = tuple((v.name, v.field, variables.shown(v), v.doc)
                  for v in variables.VARIABLES if v.help)


def env_help() -> str:
    lines = ["environment (default in brackets; every variable: docs/configuration.md):"]
    for name, _field, default, meaning in VARIABLES:
        lines.append(f"  {name:<28}{'[' + default + ']':<25} {meaning}")
    return "\n".join(lines)
