#!/usr/bin/env python3
"""Joins memory_bound_bench.cc's and memory_bound_peers.py's JSON into the issue-3 verdict table.

For each op / dtype / shape: our automatic choice in GB/s, the best peer (torch eager,
torch.compile, Triton) and the ratio, the fraction of the ceiling measured in the same run
(device copy for GeLU and softmax, read-only torch.sum for row sum), the target and pass/miss,
and the fastest forced variant of ours (a lead for the next tuning step). Writes the table as
Markdown and all rows as JSON; prints the table last.

usage: memory_bound_report.py OURS.json PEERS.json --md OUT.md --json OUT.json [--commit HASH] [--date D]
"""
import argparse
import json

TARGETS = {  # op: (ratio to best peer, fraction of ceiling, ceiling op)
    "gelu": (0.97, 0.90, "ceiling_copy"),
    "softmax": (1.00, 0.85, "ceiling_copy"),
    "rowsum": (1.00, 0.85, "ceiling_read"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("peers")
    ap.add_argument("--md", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--commit", default="")
    ap.add_argument("--date", default="")
    args = ap.parse_args()
    ours = json.load(open(args.ours))
    peers = json.load(open(args.peers))
    recs = ours["records"] + peers["records"]
    ceil = {}
    for r in peers["records"]:
        if r["op"].startswith("ceiling"):
            ceil[r["op"]] = r["gbps"]
    for r in ours["records"]:
        if r["op"] == "ceiling_copy":
            ceil["ceiling_copy_cudaMemcpy"] = r["gbps"]

    keys = []
    for r in ours["records"]:
        k = (r["op"], r["dtype"], r["rows"], r["cols"])
        if r["op"] in TARGETS and k not in keys:
            keys.append(k)
    rows_out = []
    lines = []
    hdr = ("| op | dtype | shape | ours GB/s | % ceiling | best peer | peer GB/s | ours/peer | target | "
           "fastest variant |")
    lines.append(hdr)
    lines.append("|" + "---|" * 10)
    passes = 0
    for k in keys:
        op, dt, rows, cols = k
        same = [r for r in recs if (r["op"], r["dtype"], r["rows"], r["cols"]) == k and not r.get("error")]
        mine = next((r for r in same if r["impl"] == "ours"), None)
        variants = [r for r in same if r["impl"].startswith("ours") and r["impl"] != "ours:auto-repeat"]
        rep = next((r for r in same if r["impl"] == "ours:auto-repeat"), None)
        spread = abs(rep["gbps"] - mine["gbps"]) / mine["gbps"] if rep and mine and mine["gbps"] else None
        fastest = max(variants, key=lambda r: r["gbps"]) if variants else None
        peer_rows = [r for r in same if not r["impl"].startswith("ours")]
        best = max(peer_rows, key=lambda r: r["gbps"]) if peer_rows else None
        ratio_t, frac_t, cname = TARGETS[op]
        c = ceil.get(cname, 0.0)
        g = mine["gbps"] if mine else 0.0
        frac = g / c if c else 0.0
        ratio = g / best["gbps"] if best and best["gbps"] else 0.0
        ok = mine is not None and ratio >= ratio_t and frac >= frac_t
        passes += ok
        shape = f"{rows}x{cols}" if op != "gelu" else f"{cols}"
        fv = ""
        if fastest and fastest is not mine:
            fv = f"{fastest['impl'][5:] or 'auto'} {fastest['gbps']:.0f}"
        lines.append(f"| {op} | {dt} | {shape} | {g:.0f} | {100 * frac:.1f}% | {best['impl'] if best else '-'} | "
                     f"{best['gbps'] if best else 0:.0f} | {ratio:.3f} | {'pass' if ok else 'MISS'} "
                     f"(>={ratio_t:.2f}x, >={100 * frac_t:.0f}%) | {fv} | "
                     f"{'-' if spread is None else f'{100 * spread:.1f}%'} |")
        rows_out.append(dict(op=op, dtype=dt, rows=rows, cols=cols, ours_gbps=g,
                             ours_desc=mine["desc"] if mine else "", ceiling=cname, ceiling_gbps=c,
                             fraction_of_ceiling=frac, best_peer=best["impl"] if best else None,
                             best_peer_gbps=best["gbps"] if best else 0.0, ratio_to_best_peer=ratio,
                             target_ratio=ratio_t, target_fraction=frac_t, passed=ok,
                             fastest_variant=fastest["impl"] if fastest else None,
                             fastest_variant_gbps=fastest["gbps"] if fastest else 0.0, repeat_spread=spread))
    head = [f"GPU: {ours.get('gpu')}; torch {peers.get('torch')}, triton {peers.get('triton')}; "
            f"commit {args.commit}; date {args.date}",
            "Ceilings (GB/s, same run): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(ceil.items())),
            f"Method: {ours.get('method')}", f"Targets met: {passes} of {len(keys)}", ""]
    text = "\n".join(head + lines) + "\n"
    with open(args.md, "w") as fh:
        fh.write(text)
    with open(args.json, "w") as fh:
        json.dump(dict(gpu=ours.get("gpu"), commit=args.commit, date=args.date, ceilings=ceil, verdict=rows_out,
                       records=recs), fh, indent=1)
    print(text)


if __name__ == "__main__":
    main()
