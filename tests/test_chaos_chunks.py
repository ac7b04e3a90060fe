"""benchmarks/chaos_cluster.py in chunks: every invocation writes a part, --resume runs only
the drawn faults no part has, and every chunk merges all parts (chaos.json, table.txt)."""
import contextlib
import json
import sys
import types

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))


def _run(n, kind, outcome, load=3.0):
    return {"n": n, "seed": 1, "shape": "plain", "kind": kind, "outcome": outcome,
            "took_s": 10.0 + n, "load": load, "leftover_pids": [], "leftover_shm": [],
            "at_s": 1.0}


def test_parts_merge_in_fault_order_and_resume_skips_what_is_done(tmp_path, monkeypatch):
    import chaos_cluster
    (tmp_path / "part-000.json").write_text(json.dumps(
        {"command": "a", "commit": "c1", "seed": 1, "wall_s": 5,
         "runs": [_run(0, "burst", "right error"), _run(2, "raise", "right error")]}))
    (tmp_path / "part-001.json").write_text(json.dumps(
        {"command": "b", "commit": "c2", "seed": 1, "wall_s": 7,
         "runs": [_run(1, "slow-link", "survived", 9.0)]}))
    runs = chaos_cluster.merge(tmp_path, 1, 4)
    assert [r["n"] for r in runs] == [0, 1, 2]
    merged = json.loads((tmp_path / "chaos.json").read_text())
    assert (merged["done"], merged["drawn"], merged["wall_s"]) == (3, 4, 12)
    assert merged["commits"] == ["c1", "c2"] and merged["loadavg_per_run"] == [3.0, 9.0, 3.0]
    table = (tmp_path / "table.txt").read_text()
    assert "all                  3            1            2" in table, table
    assert "median 3.0, max 9.0" in table, table
    seen = []
    monkeypatch.setattr(chaos_cluster, "run_one", lambda plan, s: seen.append(s["n"]))
    monkeypatch.setattr(chaos_cluster.netns, "Cluster", None)   # (must not be reached)
    assert chaos_cluster.main(["--faults", "3", "--resume", "--out", str(tmp_path)]) == 0
    assert seen == []                                           # all 3 drawn are done


def test_main_runs_each_shapes_undisturbed_run_then_the_faults(tmp_path, monkeypatch):
    """main()'s whole path, with a stand-in for the namespaces and for each job (the real
    ones: tests/test_chaos_cluster.py, root and minutes): the undisturbed run of each
    drawn shape first, then every fault, each written to a part and merged."""
    import chaos_cluster
    seen = []

    def run_one(plan, s):
        seen.append((s["n"], s["shape"], s["kind"]))
        return dict(_run(s["n"], s["kind"], "survived"), shape=s["shape"], w=[0.5],
                    sizes=[4], rcs=[0], last="ok", stderr_tail="")
    monkeypatch.setattr(chaos_cluster, "run_one", run_one)
    monkeypatch.setattr(chaos_cluster.netns, "Cluster",
                        lambda plan: contextlib.nullcontext(types.SimpleNamespace(plan=plan)))
    assert chaos_cluster.main(["--faults", "3", "--shapes", "elastic", "--kinds",
                               "kill-worker", "--out", str(tmp_path)]) == 0
    assert seen == [(-1, "elastic", "none")] + [(n, "elastic", "kill-worker") for n in range(3)]
    assert set(json.loads((tmp_path / "undisturbed.json").read_text())) == {"elastic"}
    assert json.loads((tmp_path / "chaos.json").read_text())["done"] == 3
