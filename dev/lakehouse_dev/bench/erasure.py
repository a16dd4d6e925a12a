"""Erasure: wall time of `lakehouse gdpr erase` for one customer and for a batch, at two lake sizes.

For each size, on a private broker and a fresh lake built the way production builds it:

1. the generator's snapshot of about N live rows (a quarter customers), then `--changes`
   change events in which orders also move between customers (`move_fraction`), so the
   erased customers have history: older versions, change-log rows, orders now of others;
2. `lakehouse ingest --once` and `lakehouse etl`, each in its own process;
3. one customer with orders erased by the CLI, in its own process; then `--customers` other
   customers with orders erased together in one run (`--customer-ids-file`), as the
   gdpr_erasure DAG erases the requests pending since its last run.

A built lake is kept (`.bench/erasure/<rows>/built`, with the generator's state) and each
run erases a copy of it, so the erasure can be measured again without building the lake
again (`--rebuild` builds it anew). The phases come from the certificates' own timings, so
the figures say where the time goes (find, sweep, purge, verification). The goal: 10 customers
in one run on a lake of about 1M live rows in at most 10 minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lakehouse_dev.bench.common import (
    DELETE_FRACTION,
    bench_dir,
    broker,
    lakehouse,
    produce_snapshot,
    save,
    say,
    table,
)
from lakehouse_dev.bench.plots import grouped_bars
from lakehouse_dev.generator.kafka import produce
from lakehouse_dev.generator.source import ShopSource
from lakehouse_dev.generator.values import WorkloadConfig
from pipelines.gdpr.certificate import certificate_path, read_certificate
from pipelines.lake import contract

SIZES = (100_000, 1_000_000)
GOAL_S = 600
# Share of order updates in the changes that give the order to another customer.
MOVE_FRACTION = 0.2


def _victims(source: ShopSource, count: int) -> list[int]:
    """`count` customers with orders, spread over the id range (and so over the file groups)."""
    state = source.state
    owners = sorted({o["customer_id"] for o in state["orders"].values()} & set(state["customers"]))
    step = max(1, len(owners) // count)
    return owners[::step][:count]


def _erase(env: dict[str, str], work: Path, rows: int, ids: list[int], reference: str) -> dict[str, Any]:
    ids_file = work / f"{reference}.ids"
    ids_file.write_text("\n".join(map(str, ids)) + "\n")
    seconds = lakehouse("gdpr", "erase", "--customer-ids-file", str(ids_file), "--reference", reference,
                        "--requested-by", "bench", env=env, log=work / f"erase-{rows}.log")
    ids_file.unlink()  # it names the customers
    certificate = read_certificate(certificate_path(env["LAKEHOUSE_ROOT"], reference))
    verification = certificate.verification
    say(f"  {len(ids)} customer(s): {seconds:.0f}s, verified: {certificate.verified}")
    return {"customers": len(ids), "seconds": round(seconds, 1), "verified": certificate.verified,
            "orders": certificate.run.orders, "orders_moved": certificate.run.orders_moved_to_other_customers,
            "phases_s": certificate.timings_s,
            "files_scanned": verification.scan.get("files"),
            # Inside the phases: the verification's reads and file scan, the purge per table.
            "verify_detail": {"reads_s": verification.reads_seconds,
                              "scan": {k: verification.scan.get(k)
                                       for k in ("seconds", "records", "seconds_by_decoder", "seconds_by_table")}},
            "purge_s": {t: done.get("seconds") for t, done in certificate.purge.items()}}


def _build(built: Path, rows: int, changes: int, seed: int) -> dict[str, Any]:
    """Build the lake once into `built` (with the generator's state); later runs reuse it."""
    shutil.rmtree(built, ignore_errors=True)
    built.mkdir(parents=True)
    with broker(f"erasure-{rows}-build") as node:
        env = {"LAKEHOUSE_ROOT": str(built / "lake"), "KAFKA_BOOTSTRAP_SERVERS": node.bootstrap,
               "LAKEHOUSE_ERASURE_KEY_FILE": str(built / "erasure.key")}
        source = ShopSource(seed)
        say(f"{rows:,} rows: producing the snapshot and {changes:,} changes")
        produce_snapshot(source, node.bootstrap, rows, seed)
        produce(source.changes(WorkloadConfig(seed=seed, customers=0, orders=0, changes=changes,
                                              delete_fraction=DELETE_FRACTION, move_fraction=MOVE_FRACTION)),
                node.bootstrap)
        seconds = lakehouse("ingest", "--once", env=env, log=built / "build.log")
        seconds += lakehouse("etl", env=env, log=built / "build.log")
    (built / "source.json").write_text(source.to_json())
    facts = {"rows": rows, "changes": changes, "seed": seed, "build_s": round(seconds, 1),
             "live_rows": sum(len(source.state[t]) for t in contract.TABLES)}
    (built / "build.json").write_text(json.dumps(facts))
    return facts


def _one_size(rows: int, changes: int, customers: int, seed: int, rebuild: bool, one: bool) -> dict[str, Any]:
    base = bench_dir() / "erasure" / f"{rows}"
    built = base / "built"
    facts = json.loads((built / "build.json").read_text()) if (built / "build.json").exists() else None
    if rebuild or facts is None or (facts["changes"], facts["seed"]) != (changes, seed):
        facts = _build(built, rows, changes, seed)
    else:
        say(f"{rows:,} rows: reusing the lake built in {built}")
    source = ShopSource.from_json((built / "source.json").read_text())
    victims = _victims(source, customers + 1)
    work = base / "run"
    shutil.rmtree(work, ignore_errors=True)
    say(f"{facts['live_rows']:,} live rows: erasing {'1 customer, then ' if one else ''}{customers} in one run, "
        "each on a copy")
    runs = []
    plan = [(victims[:1], f"BENCH-{rows}-1")] if one else []
    with broker(f"erasure-{rows}") as node:
        for ids, reference in [*plan, (victims[1:], f"BENCH-{rows}-{customers}")]:
            root = work / reference
            shutil.copytree(built / "lake", root)
            env = {"LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": node.bootstrap,
                   "LAKEHOUSE_ERASURE_KEY_FILE": str(built / "erasure.key")}
            runs.append(_erase(env, work, rows, ids, reference))
            shutil.rmtree(root)
    return {**facts, "runs": runs}


def run(sizes: tuple[int, ...], changes: int, customers: int, seed: int, rebuild: bool = False,
        one: bool = True) -> dict[str, Any]:
    figures = {"sizes": [_one_size(rows, changes, customers, seed, rebuild, one) for rows in sizes], "goal_s": GOAL_S}
    save("erasure", figures)
    results = [(f"{s['live_rows']:,} rows, {r['customers']} customer(s)", r) for s in figures["sizes"]
               for r in s["runs"]]
    phases = sorted({p for _, r in results for p in r["phases_s"]},
                    key=lambda p: -max(r["phases_s"].get(p, 0) for _, r in results))[:6]
    grouped_bars(bench_dir() / "erasure.png", "Erasure: time per phase", phases,
                 {label: [r["phases_s"].get(p, 0) for p in phases] for label, r in results}, "seconds")
    return figures


def report(figures: dict[str, Any]) -> str:
    rows = [{"live rows": f"{s['live_rows']:,}", "customers": r["customers"], "orders": r["orders"],
             "moved orders": r["orders_moved"], "erase s": r["seconds"], "verified": r["verified"],
             "files scanned": r["files_scanned"],
             "slowest phases": ", ".join(f"{p} {t:.0f}s" for p, t in sorted(
                 r["phases_s"].items(), key=lambda kv: -kv[1])[:4])}
            for s in figures["sizes"] for r in s["runs"]]
    return table(rows, ["live rows", "customers", "orders", "moved orders", "erase s", "verified", "files scanned",
                        "slowest phases"])
