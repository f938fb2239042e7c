#!/usr/bin/env python3
"""Prints the benchmark figures of one `scripts/bench.sh` run next to their goals and floors.

Reads the benchmarks' own output lines (`render-libraries …`, `render-growth …`, `render-counts …`, `render-cli …`, `watch-ingest …`,
`latency …`, `soak …`) on stdin; each line is `name key=value …`. The goals are those of the scale issues;
the floors were measured in the same run (haproxy -c on the same output, the raw JSON size of
the same objects). A figure whose benchmark did not run is left out.
"""

import re
import sys


def fields(line):
    return {k: v for k, v in re.findall(r"([a-z_0-9]+)=([^\s]+)", line)}


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def main():
    render, cli, watch, latency, bursts, setups, soak = {}, None, None, {}, {}, {}, None
    counts, paired = {}, None
    warmups, idle, reload_classify = {}, None, {}
    for line in sys.stdin:
        line = line.strip()
        f = fields(line)
        if line.startswith("render-libraries "):
            render[int(f["n"])] = f
        elif line.startswith("render-growth "):
            paired = f
        elif line.startswith("render-counts "):
            counts[int(f["n"])] = f
        elif line.startswith("render-reconcile-reload "):
            reload_classify[int(f["n"])] = f
        elif line.startswith("render-cli "):
            cli = f
        elif line.startswith("watch-ingest "):
            watch = f
        elif line.startswith("latency setup "):
            setups[int(f["ingresses"])] = f
        elif line.startswith("latency warmup "):
            warmups[int(f["ingresses"])] = f
        elif line.startswith("latency burst "):
            bursts[int(f["ingresses"])] = f
        elif line.startswith("idle "):
            idle = f
            both = re.search(r"controllers_rss_mib=\[([^\]]*)\]", line)
            idle["rss"] = [num(x) for x in both.group(1).split(",")] if both else []
        elif line.startswith("soak "):
            soak = f
        elif line.startswith("latency ") and "p95_ms" in f:
            kind = line.split()[1]
            latency[(kind, int(f["ingresses"]), f.get("standby", "running"))] = f

    rows = []  # (figure, measured, goal, floor, met)

    def row(figure, measured, goal, floor="", met=None):
        rows.append((figure, measured, goal, floor, "" if met is None else ("yes" if met else "NO")))

    for n, f in sorted(render.items()):
        full, check = num(f["full_ms"]), num(f["haproxy_check_ms"])
        goal = "< 500 ms and < haproxy -c" if n >= 10000 else "< haproxy -c"
        met = full < check and (n < 10000 or full < 500)
        row(f"render {n:,} Ingresses, full", f"{full:,.0f} ms", goal, f"haproxy -c {check:,.0f} ms", met)
        ec = num(f["endpoint_change_ms"])
        row(f"render {n:,}, one EndpointSlice change", f"{ec:,.1f} ms", "< 10 ms", f"units re-rendered {f.get('units_rendered', '?').strip('()')}", ec < 10)
        row(f"render {n:,}, one new Ingress", f"{num(f['new_ingress_ms']):,.0f} ms", "", "")
    for n, f in sorted(reload_classify.items()):
        row(f"classification of a new Ingress, {n:,} (controller and each agent)",
            f"{num(f['classify_new_ingress_ms']):,.0f} ms", "", "")
    if 1000 in render and 10000 in render:
        growth = num(render[10000]["full_ms"]) / num(render[1000]["full_ms"])
        row("render growth 1k → 10k", f"{growth:.1f}×", "≤ 11×", "linear: 10×", growth <= 11)
    if paired and paired.get("small") == "1000" and paired.get("large") == "10000":
        # The same growth from neighbouring renders: the ratio above divides medians taken a
        # minute apart, and moves with the machine's other load in between.
        g = num(paired["paired_growth"])
        row("render growth 1k → 10k, in pairs", f"{g:.2f}×", "≤ 11×",
            f"linear: 10×; {paired['pairs']} pairs from {num(paired['lowest']):.1f}× to {num(paired['highest']):.1f}×", g <= 11)
    for n, f in sorted(counts.items()):
        row(f"render {n:,}, full render counted (cachegrind)",
            f"{int(f['instructions']) / 1e6:,.0f} M instructions", "",
            f"simulated L3 misses {int(f['ll_misses']) / 1e6:,.2f} M, L1 {int(f['d1_misses']) / 1e6:,.1f} M")
    if 1000 in counts and 10000 in counts:
        growth = int(counts[10000]["instructions"]) / int(counts[1000]["instructions"])
        row("render growth 1k → 10k, instructions", f"{growth:.2f}×", "(the work, without the machine's load)",
            "linear: 10×")
    if cli:
        rss = int(cli["peak_rss_kb"]) / 1024
        raw = int(cli["raw_json_bytes"]) / 1048576
        binary = cli.get("binary", "release")
        row(f"haptic render 10k ({binary} binary), peak RSS", f"{rss:,.0f} MiB", "< 96 MiB", f"raw JSON {raw:,.1f} MiB ({rss / raw:.1f}×)", rss < 96)
        if "render_ms" in cli:
            row(f"haptic render 10k ({binary} binary), render", f"{num(cli['render_ms']):,.0f} ms",
                "(the shipped binary's full render)", f"loading the objects {num(cli['load_ms']):,.0f} ms", None)
    if watch:
        store = int(watch["store_rss_kb"]) / 1024
        raw = int(watch["raw_json_kb"]) / 1024
        row(f"watch stores, {int(watch['objects']):,} objects", f"{store:,.0f} MiB", "< 96 MiB and < 2× raw JSON",
            f"raw JSON {raw:,.1f} MiB ({store / raw:.1f}×)", store < 96 and store < 2 * raw)
        row("watch ingest", f"{num(watch['watch_events_per_s']):,.0f} events/s", "must not drop", "")
    for n, f in sorted(setups.items()):
        if "leader_rss_mib" in f:
            row(f"controller RSS, {n:,} Ingresses loaded (leader)", f"{num(f['leader_rss_mib']):,.0f} MiB", "", "")
    if idle:
        rss = idle["rss"] or [num(idle["leader_rss_mib"])]
        worst = max(rss)
        row(f"controller RSS at rest ({idle['binary']} binary, leader and standby)",
            " / ".join(f"{r:,.1f}" for r in rss) + " MiB", "< 15 MiB", "", worst < 15)
    for (kind, n, standby), f in sorted(latency.items()):
        p95 = num(f["p95_ms"])
        if kind == "endpointslice_change":
            goal = 100 if n <= 1000 else 200
            label = f"endpoint change p95, {n:,} Ingresses, standby {standby}"
        else:
            goal = 500
            label = f"new route p95, {n:,} Ingresses, standby {standby}"
        row(label, f"{p95:,.0f} ms (p50 {num(f['p50_ms']):,.0f})", f"< {goal} ms", "", p95 < goal)
    for n, f in sorted(warmups.items()):
        row(f"endpoint change p95 during warm-up, {n:,} Ingresses",
            f"{num(f['p95_ms']):,.0f} ms (p50 {num(f['p50_ms']):,.0f})", "(not a goal: start-up)",
            f"status writes settled in {num(f['until_spliced_s']):,.1f} s", None)
    for n, f in sorted(bursts.items()):
        settled, renders, reloads = num(f["settled_ms"]), int(f["renders"]), int(f["reload_pushes"])
        pods = max(int(f.get("pods", 1)), 1)
        row(f"burst of {int(f['updates']):,} EndpointSlice updates, {n:,} Ingresses",
            f"{settled:,.0f} ms, {renders} renders, {reloads // pods} reloads", "< 2 s, ≤ 5 renders, ≤ 1 reload",
            f"sent in {num(f['sent_ms']):,.0f} ms", settled < 2000 and renders <= 5 and reloads // pods <= 1)

    if soak:
        failed = int(soak["failed"])
        row(f"soak: failed requests of {int(soak['requests']):,}, seamless phases", f"{failed}", "0",
            f"HAProxy restart phase: {soak['failed_in_restart_phase']} (expected)", failed == 0)
        row("soak: drain of one pod of two", f"HAProxy gone {num(soak['drain_exit_ms']):,.0f} ms after {soak.get('drain_signal', 'USR1')}",
            "long requests in flight complete", f"{soak['drain_long_in_flight']} long requests in flight", None)

    if not rows:
        return
    widths = [max(len(r[i]) for r in rows + [("figure", "measured", "goal", "floor (same run)", "met")]) for i in range(5)]
    header = ("figure", "measured", "goal", "floor (same run)", "met")
    print()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
