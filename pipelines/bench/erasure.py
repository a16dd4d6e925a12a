"""Erasure: wall time of `lakehouse gdpr erase` for one customer, at two lake sizes.

Each lake is built the way production builds it (ingest, etl), then one customer with
orders is erased by the CLI in its own process. The phases come from the certificate's
own timings, so the figure says where the time goes (sweep, purge, verification scan).
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from pipelines import contract
from pipelines.bench.common import bench_dir, broker, lakehouse, produce_backlog, save, say, table
from pipelines.bench.plots import grouped_bars

SIZES = (20_000, 200_000)


def run(sizes: tuple[int, ...], seed: int) -> dict[str, Any]:
    work = bench_dir() / "erasure"
    shutil.rmtree(work, ignore_errors=True)
    results = []
    for events in sizes:
        root = work / f"lake-{events}"
        with broker("erasure") as node:
            env = {"LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": node.bootstrap,
                   "LAKEHOUSE_ERASURE_KEY_FILE": str(work / "erasure.key")}
            backlog = produce_backlog(node.bootstrap, events, seed)
            state = backlog.source.state
            say(f"{events:,} events: building the lake")
            lakehouse("ingest", "--once", env=env, log=work / f"build-{events}.log")
            lakehouse("etl", env=env, log=work / f"build-{events}.log")
            with_orders = {o["customer_id"] for o in state["orders"].values()} & set(state["customers"])
            victim = min(with_orders)
            live = sum(len(state[t]) for t in contract.TABLES)
            say(f"{events:,} events ({live:,} live rows): erasing customer {victim}")
            seconds = lakehouse("gdpr", "erase", "--customer-id", str(victim), "--reference", f"BENCH-{events}",
                                "--requested-by", "bench", env=env, log=work / f"erase-{events}.log")
            certificate = json.loads((root / "_gdpr" / "certificates" / f"BENCH-{events}.json").read_text())
            say(f"  {seconds:.0f}s, verified: {certificate['verified']}")
            results.append({"events": events, "live_rows": live, "seconds": round(seconds, 1),
                            "verified": certificate["verified"], "phases_s": certificate["timings_s"],
                            "files_scanned": certificate["verification"].get("scan", {}).get("files")})
    figures = {"sizes": results}
    save("erasure", figures)
    phases = sorted({p for r in results for p in r["phases_s"]}, key=lambda p: -max(
        r["phases_s"].get(p, 0) for r in results))[:6]
    grouped_bars(bench_dir() / "erasure.png", "Erasure of one customer: time per phase",
                 phases, {f"{r['live_rows']:,} rows": [r["phases_s"].get(p, 0) for p in phases] for r in results},
                 "seconds")
    return figures


def report(figures: dict[str, Any]) -> str:
    rows = [{"backlog events": f"{r['events']:,}", "live rows": f"{r['live_rows']:,}", "erase s": r["seconds"],
             "verified": r["verified"],
             "slowest phases": ", ".join(f"{p} {s:.0f}s" for p, s in sorted(
                 r["phases_s"].items(), key=lambda kv: -kv[1])[:3])} for r in figures["sizes"]]
    return table(rows, ["backlog events", "live rows", "erase s", "verified", "slowest phases"])
