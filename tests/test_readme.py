"""The README and docs/index.md stay true: the two commands, the files and benchmark
commands the README names exist, its example is examples/torch/quickstart.py, the index
lists every doc, and the user docs carry no run dates, issue numbers or VM nicknames
(those belong to the development log).  In-process, a few milliseconds."""
from __future__ import annotations

import re

from conftest import ROOT

README = (ROOT / "README.md").read_text()
INDEX = (ROOT / "docs" / "index.md").read_text()


def test_sections_in_order_and_the_two_commands():
    heads = [h.lower() for h in re.findall(r"^## (.+)$", README, re.M)]
    want = ["why and when", "two commands", "example", "features", "documentation"]
    found = [next(i for i, h in enumerate(heads) if w in h) for w in want]
    assert found == sorted(found), heads
    assert re.search(r"^make demo\s+#", README, re.M) and re.search(r"^make test\s+#", README,
                                                                    re.M)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_the_example_is_the_quickstart_file():
    block = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    assert block == (ROOT / "examples" / "torch" / "quickstart.py").read_text()
    assert len([ln for ln in block.splitlines() if ln.strip()]) <= 14


def test_named_files_and_benchmark_commands_exist():
    links = re.findall(r"\]\(((?:docs|examples|benchmarks|tests)/[^)#]+)", README)
    paths = re.findall(r"\b((?:benchmarks|examples|tests)/[\w/.-]+\.py)\b", README)
    modules = re.findall(r"python -m (benchmarks(?:\.\w+)+)", README)
    assert links and paths and modules
    for rel in links + paths + [m.replace(".", "/") + ".py" for m in modules]:
        assert (ROOT / rel).exists(), f"README.md names {rel}, which does not exist"


def test_feature_table_names_every_feature():
    table = README.split("## Features", 1)[1].split("\n## ", 1)[0].lower()
    for feature in ("plugins", "algorithms", "compression", "join", "elastic", "replication",
                    "launchers", "autotune", "metrics", "compatibility.md"):
        assert feature in table, feature


def test_index_lists_every_doc_and_its_links_resolve():
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", INDEX))
    docs = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert docs <= linked, f"docs/index.md does not list {sorted(docs - linked)}"
    assert all((ROOT / "docs" / name).exists() for name in linked)
    guides = INDEX.split("## User guides", 1)[1].split("\n## ", 1)[0]
    assert "speed_log.md" not in guides and "compression_results.md" not in guides


LAB_NOTES = re.compile(r"\b20\d\d-\d\d-\d\d\b|\(issue \d+|\bissue \d+\b|\bissue #\d+"
                       r"|\b(?:this|the|morning|evening) (?:2-core |2-vCPU |development |CI )?VM\b"
                       r"|\bmorning\b|\bevening\b", re.I)


def test_user_docs_carry_no_run_dates_issue_numbers_or_vm_nicknames():
    guides = INDEX.split("## User guides", 1)[1].split("\n## ", 1)[0]
    files = {"README.md": README}
    for name in sorted(set(re.findall(r"\]\(([\w.-]+\.md)\)", guides))):
        files[f"docs/{name}"] = (ROOT / "docs" / name).read_text()
    problems = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
                for name, text in files.items() for m in LAB_NOTES.finditer(text)]
    assert not problems, ("run dates, issue numbers and VM nicknames go to the development "
                          "log (docs/speed_log.md), not user docs:\n" + "\n".join(problems))
