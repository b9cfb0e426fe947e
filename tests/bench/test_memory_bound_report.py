"""The memory-bound benchmark's round-by-round statistic (bench/gpu/paired_stats.py) and how the
verdict table (bench/gpu/memory_bound_report.py) shows it: a miss whose interval reaches the
target is marked a tie and still counted a miss."""
import json
import os
import random
import subprocess
import sys

BENCH = os.environ.get("FUSEBOX_BENCH_DIR",
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gpu"))
sys.path.insert(0, BENCH)

from paired_stats import paired_ratio  # noqa: E402


def test_paired_ratio_finds_a_small_steady_lead_under_drift():
    rng = random.Random(7)
    drift = [1.0 + 0.05 * (r / 300) + rng.gauss(0, 0.01) for r in range(300)]  # both see it
    fast = [d * (1 + rng.gauss(0, 0.001)) for d in drift]
    slow = [d * 1.003 * (1 + rng.gauss(0, 0.001)) for d in drift]
    med, lo, hi, n = paired_ratio(fast, slow)
    assert n == 300
    assert lo <= med <= hi
    assert 1.0 < lo and abs(med - 1.003) < 0.001  # 0.3% resolved through 5% of drift


def test_paired_ratio_interval_spans_one_for_a_tie():
    rng = random.Random(3)
    a = [1.0 + rng.gauss(0, 0.01) for _ in range(200)]
    b = [1.0 + rng.gauss(0, 0.01) for _ in range(200)]
    _, lo, hi, _ = paired_ratio(a, b)
    assert lo < 1.0 < hi


def test_paired_ratio_interval_is_the_order_statistics_of_the_median():
    # 100 ratios 1..100 / 100: ranks 40 and 61 (1-based) for n = 100.
    fast = [1.0] * 100
    slow = [i / 100 for i in range(100, 0, -1)]
    med, lo, hi, n = paired_ratio(fast, slow)
    assert (lo, med, hi, n) == (0.40, 0.505, 0.61, 100)


def test_paired_ratio_needs_the_same_rounds():
    assert paired_ratio([1.0] * 20, [1.0] * 19) is None
    assert paired_ratio([1.0] * 5, [1.0] * 5) is None
    assert paired_ratio(None, [1.0] * 20) is None


def _run_report(tmp_path, peer_gbps, paired):
    def rec(impl, gbps, **kw):
        return dict(op="rowsum", dtype="float32", rows=8192, cols=8192, impl=impl, desc="", bytes=268435456,
                    ms=268435456 / (gbps * 1e6), ms_min=0, ms_max=0, gbps=gbps, error="", **kw)
    ceiling = dict(op="ceiling_read", dtype="bytes", rows=1, cols=1 << 30, impl="torch_sum", desc="",
                   bytes=1 << 30, ms=0.25, ms_min=0, ms_max=0, gbps=4288.0, error="")
    ours = {"gpu": "test", "method": "test", "records": [rec("ours", 4300.0), ceiling]}
    peers = {"torch": "t", "triton": "t", "method": "m",
             "records": [rec("ours", 4300.0), rec("torch_compile", peer_gbps, paired_ours_ratio=paired), ceiling]}
    for name, doc in (("ours.json", ours), ("peers.json", peers)):
        (tmp_path / name).write_text(json.dumps(doc))
    subprocess.run([sys.executable, os.path.join(BENCH, "memory_bound_report.py"), str(tmp_path / "ours.json"),
                    str(tmp_path / "peers.json"), "--md", str(tmp_path / "out.md"), "--json",
                    str(tmp_path / "out.json")], check=True, capture_output=True)
    rows = json.loads((tmp_path / "out.json").read_text())["verdict"]
    return rows[0], (tmp_path / "out.md").read_text()


def test_report_marks_a_miss_inside_the_interval_as_a_tie(tmp_path):
    row, md = _run_report(tmp_path, 4308.0, dict(median=0.998, lo95=0.996, hi95=1.001, rounds=100))
    assert not row["passed"] and row["tie"]
    assert "MISS (tie)" in md and "0.9980 [0.9960, 1.0010]" in md
    assert "Targets met: 0 of 1 (1 of the misses ties" in md


def test_report_keeps_a_resolved_miss_a_plain_miss(tmp_path):
    row, md = _run_report(tmp_path, 4340.0, dict(median=0.991, lo95=0.989, hi95=0.993, rounds=100))
    assert not row["passed"] and not row["tie"]
    assert "| MISS (>=" in md


def test_report_passes_without_a_paired_record(tmp_path):
    row, md = _run_report(tmp_path, 4200.0, None)
    assert row["passed"] and not row["tie"]
    assert "| pass (>=" in md


def _dry_run(*args):
    out = subprocess.run([sys.executable, os.path.join(BENCH, "sweep.py"), "--dry-run", *args],
                         check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "MiB moved" in line and not line.startswith(("part", "sweep"))
            and "shapes," not in line]


def test_sweep_parts_split_one_seeds_plan_into_disjoint_pieces_that_cover_it():
    whole = _dry_run("--seed", "11", "--shapes", "6")
    parts = [_dry_run("--seed", "11", "--shapes", "6", "--part", f"{k}/3") for k in (1, 2, 3)]
    assert len(whole) == 6 * 9
    assert sorted(line for p in parts for line in p) == sorted(whole)
    assert [len(p) for p in parts] == [18, 18, 18]


def test_sweep_markdown_merges_the_parts_json_and_refuses_parts_of_other_seeds(tmp_path):
    def rec(i):
        return dict(op="gelu", dtype="float32", dims=[1000 + i], kind="odd", offset=0, bytes=8000 + 8 * i,
                    timing="graph", ours_us=2.0, best="triton", best_us=2.0, ratio=1.0, ratio_lo=0.99,
                    ratio_hi=1.01, target_peer=True, pct_copy=None, target_copy=None, desc="")
    meta = dict(seed=5, commit="abc", date="2026-12-07 10:00 UTC", gpu="GPU", method="m",
                shapes_per_op_dtype=40, elapsed_s=10.0)
    paths = []
    for k in (1, 2):
        p = tmp_path / f"p{k}.json"
        p.write_text(json.dumps(dict(meta=dict(meta, part=f"{k}/2"), records=[rec(k), rec(10 + k)])))
        paths.append(str(p))
    merged, md = tmp_path / "all.json", tmp_path / "all.md"
    subprocess.run([sys.executable, os.path.join(BENCH, "sweep.py"), "--from-json", *paths,
                    "--json", str(merged), "--md", str(md)], check=True, capture_output=True)
    d = json.loads(merged.read_text())
    assert len(d["records"]) == 4 and d["meta"]["elapsed_s"] == 20.0 and d["meta"]["part"] == "1/2, 2/2"
    assert "Targets met: 4 of 4" in md.read_text()
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(meta=dict(meta, seed=6, part="2/2"), records=[rec(3)])))
    r = subprocess.run([sys.executable, os.path.join(BENCH, "sweep.py"), "--from-json", paths[0], str(other),
                        "--json", str(merged), "--md", str(md)], capture_output=True, text=True)
    assert r.returncode != 0 and "differ in seed" in r.stderr
