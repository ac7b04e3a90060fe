"""docs/compatibility.md lists exactly the core's refusal rules (byteps.core.compat), and
each rule raises one error naming the subject, the reason and the fix."""
from __future__ import annotations

import pytest

from conftest import ROOT
from byteps.core import compat

BEGIN, END = "<!-- rules:begin -->", "<!-- rules:end -->"


def test_document_lists_every_rule():
    text = (ROOT / "docs" / "compatibility.md").read_text()
    assert BEGIN in text and END in text, "docs/compatibility.md lost its rule markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip() + "\n"
    want = compat.markdown_table()
    assert table == want, ("docs/compatibility.md differs from byteps/core/compat.py's rules; "
                           "paste this between the markers:\n" + want)


@pytest.mark.parametrize("rule_id", list(compat.RULES))
def test_rule_error_names_subject_reason_and_fix(rule_id):
    r = compat.RULES[rule_id]
    with pytest.raises(r.error) as exc:
        compat.refuse(rule_id, "tensor 'w' on rank 1")
    msg = str(exc.value)
    assert msg.startswith("tensor 'w' on rank 1: ") and r.reason in msg and r.fix in msg
    assert "not available" not in r.reason and "not implemented" not in r.reason.lower()
