"""GDPR erasure (contract section 4) on lakes built by the real pipeline: real Kafka, Spark, Hudi.

The independent model says what the lake must hold after an erasure: the source folded as
usual (tests/model.py), minus the erased customers, their orders, and every order id that
ever belonged to them (the registry blocks those ids for good). Tables are read back with
Spark and with hudi-rs; `lake_scan` decodes every file under the root.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from pyspark.sql import SparkSession

from lakehouse_dev.generator import Message, WorkloadConfig
from pipelines.gdpr.erase import erase, erase_all
from pipelines.gdpr.request import parse_request
from pipelines.gdpr.scan import Subject, scan_lake
from pipelines.ingest.bronze import run_ingest
from pipelines.lake.catalog import lake_tables
from pipelines.lake.contract import TABLES, topic
from pipelines.lake.hudi_timeline import PURGE_FROM_META, latest_meta
from pipelines.lake.layout import table_path
from pipelines.lake.table_stats import has_completed_commit, read_table
from pipelines.runtime.lake import Lake
from pipelines.transform.changes import read_changes
from pipelines.transform.etl import run_etl
from tests.kill import bronze_as_model, running_ingest, wait_while_running
from tests.lake import LakeCopy, assert_bronze_equals_model, assert_lake_equals_model, run_cli
from tests.model import Rows, expected_silver, fold_with_lsn, row_event, unwrap

pytestmark = pytest.mark.integration


def keyed(cfg: WorkloadConfig) -> WorkloadConfig:
    """The workload without keyless records, as a source must send once erasure has compacted its topics.

    Kafka refuses a record without a key on a compacted topic; of what the generator sends,
    only some malformed records have none (and truncates, which these tests do not send).
    """
    return dataclasses.replace(cfg, malformed_fraction=0.0)


def erased_model(sent: list[Message], customers: set[int], orders: set[int]) -> tuple[Rows, dict]:
    """The model's state and LSNs without the erased customers and orders.

    `orders`: the customers' orders (theirs_and_moved); an order the source has given to
    another customer since is that customer's, and stays.
    """
    state, lsns = fold_with_lsn(sent)
    gone = {"customers": set(customers),
            "orders": orders | {k for k, v in state["orders"].items() if v["customer_id"] in customers}}
    return ({t: {k: v for k, v in state[t].items() if k not in gone[t]} for t in TABLES},
            {t: {k: v for k, v in lsns[t].items() if k not in gone[t]} for t in TABLES})


def orders_of(sent: list[Message], customers: set[int]) -> set[int]:
    """Every order id the source ever gave the customers."""
    found = set()
    for m in sent:
        event = row_event(unwrap(m)[1])
        if m.topic == topic("orders") and event and event[3].get("customer_id") in customers:
            found.add(event[1])
    return found


def theirs_and_moved(sent: list[Message], customers: set[int]) -> tuple[set[int], set[int]]:
    """Of the orders the source ever gave the customers: those whose newest version (by LSN) is still
    theirs (deleted since or not), and those the source has given to another customer since."""
    newest: dict[int, tuple[int, int]] = {}
    for m in sent:
        event = row_event(unwrap(m)[1])
        if m.topic == topic("orders") and event and event[0] != "d":
            _, key, lsn, row = event
            if lsn > newest.get(key, (-1, 0))[0]:
                newest[key] = (lsn, row["customer_id"])
    ever = orders_of(sent, customers)
    theirs = {o for o in ever if newest[o][1] in customers}
    return theirs, ever - theirs


def _orders_stayed(sent: list[Message], state: Rows, customer: int) -> bool:
    """Every order the source ever gave `customer` is live and still theirs.

    The lake cannot link an order to a customer it never saw them together in: one that was
    deleted, or moved to another customer, before any ingest saw it under this one (both occur
    when a whole history is ingested in one batch). The lake holds nothing of the customer
    for such an order, but the model here would count it as theirs; these tests choose
    customers without them, and move orders only after the lake has seen them.
    """
    return all(state["orders"].get(o, {}).get("customer_id") == customer for o in orders_of(sent, {customer}))


def texts_of(sent: list[Message], customers: set[int]) -> set[str]:
    """Every e-mail and name the source ever had for the customers and for nobody else.

    A name another customer also has (the generator draws names from short lists) proves
    nothing when found: the erasure, too, checks those by ids only.
    """
    mine, others = set(), []
    for m in sent:
        event = row_event(unwrap(m)[1])
        if m.topic == topic("customers") and event and event[0] != "d":
            values = {event[3]["email"].strip(), event[3]["full_name"].strip()}
            if event[1] in customers:
                mine |= values
            else:
                others += [v.lower() for v in values]
    return {t for t in mine if len(t) >= 4 and not any(t.lower() in o for o in others)}


def snapshot(spark: SparkSession, root: str) -> dict[str, set[tuple]]:
    """Every non-gold table's rows (without Hudi's meta columns), as sets."""
    out = {}
    for table in lake_tables(root, Lake.at(root).declaration):
        if table.name.startswith("gold/") or not has_completed_commit(table.path):
            continue
        df = spark.read.format("hudi").load(table.path)
        df = df.select(*sorted(c for c in df.columns if not c.startswith("_hoodie_") or c == "_hoodie_is_deleted"))
        out[table.name] = {tuple((c, _plain(r[c])) for c in df.columns) for r in df.collect()}
    return out


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, bytearray) else value


def of_subject(name: str, row: tuple, customers: set[int], orders: set[int], texts: set[str]) -> bool:
    """Independent of pipelines.gdpr.erase: does a snapshot row belong to the erased customers?"""
    r = dict(row)
    if r.get("customer_id") in customers:
        return True
    if "customers" in name and r.get("id") in customers:
        return True
    if "orders" in name and r.get("id") in orders:
        return True
    blob = " ".join(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in r.values()).lower()
    if any(t.lower() in blob for t in texts):
        return True
    ids = [int(i) for i in re.findall(r'"(?:id|customer_id)"\s*:\s*(\d+)', blob)]
    return name == "bronze/_dead_letters" and any(i in customers | orders for i in ids)


def dead_letter(customer: dict[str, Any]) -> Message:
    """A record of the customer that is not valid JSON: it lands in the dead letters, with their e-mail."""
    image = {c: customer[c] for c in ("id", "email", "full_name")}
    value = json.dumps({"op": "u", "after": image})[:-2]  # cut short: not JSON any more
    return Message(topic("customers"), json.dumps({"id": customer["id"]}).encode(), value.encode())


def _key_id(key: bytes | None) -> object:
    """The id of a Kafka key `{"id": N}`; None for the keys malformed records have (none, or not JSON)."""
    try:
        doc = json.loads(key) if key is not None else None
    except ValueError:
        return None
    return doc.get("id") if isinstance(doc, dict) else None


def _records(bootstrap: str, keys: set[int]) -> list[tuple[int, bytes, int, bool]]:
    """(key, key bytes, partition, is tombstone) of every record of `keys` on the customers topic."""
    consumer = KafkaConsumer(topic("customers"), bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=5000)
    found = [(k, m.key, m.partition, m.value is None) for m in consumer if (k := _key_id(m.key)) in keys]
    consumer.close()
    return found


def _timelines(root: str) -> dict[str, int]:
    return {p.parent.parent.name: len(list(p.glob("*"))) for p in Path(root).rglob(".hoodie/timeline")}


def test_erasure_leaves_nothing_and_changes_nobody_else(spark, lake: LakeCopy, tmp_path, monkeypatch,
                                                         caplog) -> None:
    for key, value in {"LAKEHOUSE_ERASURE_KEY_FILE": str(tmp_path / "erasure.key"), "LAKEHOUSE_ROOT": lake.root,
                       "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap}.items():
        monkeypatch.setenv(key, value)
    root, source, sent, cfg = lake.root, lake.source, lake.sent, lake.cfg
    state = fold_with_lsn(sent)[0]
    with_orders = [c for c in sorted({o["customer_id"] for o in state["orders"].values()} & state["customers"].keys())
                   if _orders_stayed(sent, state, c)]
    quarantined = [c for c in sorted(expected_silver(state)[1]["customers"]) if _orders_stayed(sent, state, c)]
    victims = {with_orders[0], quarantined[0]}

    # Bad requests get a clear outcome and change nothing.
    timelines = _timelines(root)
    for args, says in (
        ([], "no customer id given"),
        (["--customer-ids", ""], "not a customer id"),
        (["--customer-id", "12a"], "#1 ('12a')"),
        (["--customer-id", "-3"], "not a customer id"),
        (["--customer-ids", ",".join(str(i) for i in range(1, 1002))], "at most 1000"),
        (["--customer-id", "1", "--reference", "bad reference!"], "reference 'bad reference!'"),
    ):
        done = run_cli("gdpr", "erase", *args, *([] if "--reference" in args else ["--reference", "REQ-BAD"]))
        assert done.exit_code == 2, (args, done.stderr[-2000:])
        assert says in done.stderr, (says, done.stderr[-2000:])
    assert not (Path(root) / "_gdpr").exists() and _timelines(root) == timelines, "a rejected request wrote something"

    # A dead letter that holds a victim's e-mail. Orders move between customers (the workload's
    # moves, and one of a victim's orders given to a customer who stays), ingested and through
    # silver and gold: the lake holds versions of that order naming the victim, and its
    # current row, the other customer's.
    victim, other = with_orders[0], next(c for c in sorted(state["customers"]) if c not in victims)
    mine = sorted(o for o, row in state["orders"].items() if row["customer_id"] == victim)
    moves = dataclasses.replace(keyed(cfg), changes=300, move_fraction=0.5, delete_fraction=0.0)
    lake.produce([dead_letter(state["customers"][victim]), *source.update("orders", mine[0], {"customer_id": other}),
                  *source.changes(moves)])
    run_ingest(Lake.at(root, spark), once=True, bootstrap=lake.bootstrap)
    run_etl(Lake.at(root, spark))

    (orders, moved), texts = theirs_and_moved(sent, victims), texts_of(sent, victims)
    assert orders and texts and mine[0] in moved
    assert len({o["customer_id"] for o in fold_with_lsn(sent)[0]["orders"].values()}) > 1
    before = snapshot(spark, root)
    assert any(of_subject("bronze/_dead_letters", r, victims, orders, texts) for r in before["bronze/_dead_letters"])
    assert any(dict(r)["id"] == mine[0] and dict(r)["customer_id"] == victim
               for r in before["bronze/_changelog/orders"])

    # Two requests, one run: a sweep, a purge and a verification for both, a certificate each.
    certificates = erase_all(Lake.at(root, spark),
                             [parse_request([victim, quarantined[0], victim], "REQ-2026-001", "dpo@shop.example"),
                              parse_request([quarantined[0]], "REQ-2026-002", "dpo@shop.example")],
                             bootstrap=lake.bootstrap)
    assert [c.reference for c in certificates] == ["REQ-2026-001", "REQ-2026-002"]
    assert len({c.path for c in certificates}) == 2
    certificate = certificates[0]
    for done in certificates:
        assert done.verified, done.verification.failures
        assert done.status == "erased" and done.run.references == ["REQ-2026-001", "REQ-2026-002"]
    assert certificate.subjects.duplicates_in_request == 1 and len(certificate.subjects.customers) == 2
    assert certificate.run.orders_moved_to_other_customers == len(moved)
    assert certificate.verification.scan["findings"] == 0
    assert not certificate.further_sweeps, "the targeted purge left something behind"

    # Every other row of every table is exactly as before; gold equals the contract without them.
    after = snapshot(spark, root)
    for name, rows in before.items():
        kept = {r for r in rows if not of_subject(name, r, victims, orders, texts)}
        assert after.get(name, set()) == kept, f"{name}: rows of other customers changed"
    expected, lsns = erased_model(sent, victims, orders)
    assert {o for o in moved if o in expected["orders"]} == {o for o in moved if o in fold_with_lsn(sent)[0]["orders"]}
    assert expected["orders"][mine[0]]["customer_id"] == other  # and counts in gold: the model says so
    assert_bronze_equals_model(spark, root, expected, lsns)
    assert_lake_equals_model(spark, root, expected)
    for table in lake_tables(root, Lake.at(root).declaration):  # the independent reader sees none of them either
        if has_completed_commit(table.path):
            rows = read_table(table.path).to_pylist()
            assert not [r for r in rows if of_subject(table.name, tuple(r.items()), victims, orders, texts)], \
                f"hudi-rs finds the subject in {table.name}"

    # Neither the certificate nor the audit log repeats the personal data.
    gdpr_dir = Path(root) / "_gdpr"
    for path in (Path(str(certificate.path)), gdpr_dir / "audit.jsonl"):
        text = path.read_text()
        assert not [t for t in texts if t.lower() in text.lower()], f"{path.name} holds an e-mail or name"
        assert not re.search(r'"(id|customer_id|customer_ids|email|full_name)"', text)
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in certificate.subjects.customers)

    # Kafka: compacted topics, and a tombstone for each erased key.
    admin = KafkaAdminClient(bootstrap_servers=lake.bootstrap)
    try:
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic(t)) for t in TABLES])
    finally:
        admin.close()
    (per_topic,) = described.values()
    assert set(per_topic) == {topic(t) for t in TABLES}
    for name, configs in per_topic.items():
        policy = configs["cleanup.policy"]
        assert (policy.get("value") if isinstance(policy, dict) else policy) == "compact", (name, policy)
    # A tombstone for each key. The broker removes the raw events only from closed segments older
    # than min.compaction.lag.ms (a day), which this test does not wait for.
    # Compaction keeps one record per key *bytes* and partition: a record's key must have a tombstone of the same
    # bytes, so in the same partition (the contract's `{"id": 5}` and Connect's `{"id":5}` are two keys), or the
    # record is never removed.
    records = _records(lake.bootstrap, victims)
    assert {k for k, _, _, dead in records if dead} == victims
    assert {(key, p) for _, key, p, dead in records if not dead} <= {(key, p) for _, key, p, dead in records if dead}

    # The source goes on, replays included (also of the erased customers): nothing comes back. The ETL reads on
    # from its checkpoints (the purge cleaned every older version): no table is rebuilt from a full read.
    lake.produce(source.changes(keyed(cfg)))
    run_ingest(Lake.at(root, spark), once=True, bootstrap=lake.bootstrap)
    with caplog.at_level(logging.INFO, logger="pipelines"):
        report = run_etl(Lake.at(root, spark))
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "rebuilding" in m or "no longer readable" in m], said
    assert [m for m in said if "read by commit time" in m], "silver's reads were not after a purge"
    assert [m for m in said if "after an erasure's purge" in m], "gold's reads were not after a purge"
    assert not [t for t, counts in report.items() if "rebuilt" in counts], report
    # A `lakehouse changes` consumer that had read up to where the purge began reads on after it: no snapshot.
    for layer, name in (("gold", "daily_revenue"), ("silver", "customers")):
        began = latest_meta(spark, table_path(layer, name, root), PURGE_FROM_META)
        assert began, f"{layer}/{name}: the purge did not record that its commits were all its own"
        after = read_changes(Lake.at(root, spark), f"{layer}/{name}", began)
        assert not after.snapshot and after.rows.count() > 0, f"{layer}/{name}"
    expected, lsns = erased_model(sent, victims, orders)
    assert_bronze_equals_model(spark, root, expected, lsns)
    assert_lake_equals_model(spark, root, expected)
    texts = texts_of(sent, victims)  # a new customer may have been given one of their names meanwhile
    assert scan_lake(Lake.at(root, spark), Subject(frozenset(victims), frozenset(orders), frozenset(texts))).clean

    # A second request for the same customers, from the command line, with an id the lake never
    # saw (the source's ids are small), given twice: nothing left, proven so, nobody touched.
    before = snapshot(spark, root)
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("# erased before\n" + ",".join(map(str, sorted(victims))) + "\n\n987654321\n")
    done = run_cli("gdpr", "erase", "--customer-ids-file", str(ids_file), "--customer-id", "987654321",
                   "--reference", "REQ-2026-001b", "--requested-by", "dpo@shop.example")
    assert done.exit_code == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["status"] == "nothing left to erase" and summary["verified"] and summary["rows_removed"] == 0
    again = json.loads(Path(summary["certificate"]).read_text())
    assert again["subjects"]["duplicates_in_request"] == 1 and not again["further_sweeps"]
    assert snapshot(spark, root) == before
    assert_lake_equals_model(spark, root, expected)
    assert len((gdpr_dir / "audit.jsonl").read_text().splitlines()) == 3


def _client(spark: SparkSession, root: str, name: str):
    from pipelines.runtime.hudi_client import WriteClient

    return WriteClient(spark, {t.name: t for t in lake_tables(root, Lake.at(root).declaration)}[name])


def test_erasure_with_a_savepoint_and_a_pending_compaction(spark, lake: LakeCopy, tmp_path, monkeypatch) -> None:
    """Savepoints pin old file slices and the cleaner keeps files a pending compaction needs: neither may hide data.

    On a copy of the shared lake, whose first etl ran with inline services. The victim's
    silver row changes before the erasure, and may leave silver for quarantine (the workload's
    invalid updates): then the sweep finds no live row in silver/customers, whose newest slice
    still keeps the old row as a change-feed before-image. That file group is written once
    more (pipelines.gdpr.purge.change_feed_holders): before, this erasure did not verify.
    """
    from pipelines.lake.hudi_timeline import earliest_retained
    from tests.hudi_files import log_files, pending_compactions

    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY_FILE", str(tmp_path / "erasure.key"))
    monkeypatch.setenv("LAKEHOUSE_TABLE_SERVICES", "external")  # no inline compaction: log files stay
    root, source, sent = lake.root, lake.source, lake.sent
    cfg = dataclasses.replace(lake.cfg, delete_fraction=0.0)  # the victim lives on
    state = fold_with_lsn(sent)[0]
    victim = next(c for c in sorted({o["customer_id"] for o in state["orders"].values()} & state["customers"].keys())
                  if _orders_stayed(sent, state, c))
    # The victim changes in the next batch: their old row stays in a base file, the new one in a log file.
    lake.produce(source.update("customers", victim, {"full_name": "Zelda Erasable"}) + source.changes(cfg))
    run_ingest(Lake.at(root, spark), once=True, bootstrap=lake.bootstrap)
    run_etl(Lake.at(root, spark))
    assert log_files(f"{root}/bronze/customers")
    # The case this lake gives: the victim's newest version failed silver's rules.
    assert victim in expected_silver(fold_with_lsn(sent)[0])[1]["customers"], "the victim is not in quarantine"

    saved = {}
    for name in ("bronze/customers", "silver/customers", "gold/customer_ltv"):
        with _client(spark, root, name) as c:
            c.client.savepoint("test", "before an erasure")
            saved[name] = c.meta.reloadActiveTimeline().getSavePointTimeline().countInstants()
    for name in ("bronze/customers", "bronze/orders"):
        with _client(spark, root, name) as c:
            assert c.client.scheduleCompaction(c.jvm.org.apache.hudi.common.util.Option.empty()).isPresent()
    assert pending_compactions(f"{root}/bronze/customers")
    # A batch after the plan: its log files belong to the slice the pending compaction opens.
    lake.produce(source.update("customers", victim, {"full_name": "Zelda Erasable-Again"}))
    run_ingest(Lake.at(root, spark), once=True, bootstrap=lake.bootstrap)

    orders, texts = orders_of(sent, {victim}), texts_of(sent, {victim})
    assert {"Zelda Erasable", "Zelda Erasable-Again"} <= texts
    assert not scan_lake(Lake.at(root, spark), Subject(frozenset({victim}), frozenset(orders), frozenset(texts))).clean

    certificate = erase(Lake.at(root, spark), parse_request([victim], "REQ-SAVEPOINT", "dpo"),
                        bootstrap=lake.bootstrap)
    assert certificate.verified, certificate.verification.failures
    assert not certificate.further_sweeps, "the targeted purge left something behind"
    purge = certificate.purge
    assert purge["bronze/customers"]["savepoints_deleted"] and purge["silver/customers"]["savepoints_deleted"]
    assert len(purge["bronze/customers"]["compactions"]) >= 2  # the pending plan, then one after the sweep
    assert purge["silver/customers"]["rewritten_file_groups"], "silver's newest change feed kept the victim"
    assert not pending_compactions(f"{root}/bronze/customers")
    for name, count in saved.items():  # the restore point is kept, at the erased state
        with _client(spark, root, name) as c:
            savepoints = c.meta.reloadActiveTimeline().getSavePointTimeline().filterCompletedInstants()
            assert savepoints.countInstants() == count
            assert savepoints.lastInstant().get().requestedTime() >= earliest_retained(spark, c.table.path)
    assert scan_lake(Lake.at(root, spark), Subject(frozenset({victim}), frozenset(orders), frozenset(texts))).clean
    for path in Path(root).rglob("*"):  # and not even a raw byte of the new names
        if path.is_file():
            assert b"Zelda Erasable" not in path.read_bytes(), path
    expected, lsns = erased_model(sent, {victim}, orders)
    assert_bronze_equals_model(spark, root, expected, lsns)
    run_etl(Lake.at(root, spark))
    assert_lake_equals_model(spark, root, expected)


def test_erasure_while_ingest_runs(spark, lake: LakeCopy, tmp_path, monkeypatch) -> None:
    """The stream keeps going beside the erasure, the source keeps changing the customer: nothing comes back."""
    root, source, sent = lake.root, lake.source, lake.sent
    env = {**os.environ, "LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap,
           "LAKEHOUSE_TABLE_SERVICES": "external", "LAKEHOUSE_ERASURE_KEY_FILE": str(tmp_path / "erasure.key")}
    for k in ("LAKEHOUSE_TABLE_SERVICES", "LAKEHOUSE_ERASURE_KEY_FILE"):
        monkeypatch.setenv(k, env[k])
    state = fold_with_lsn(sent)[0]
    victim = next(c for c in sorted({o["customer_id"] for o in state["orders"].values()} & state["customers"].keys())
                  if _orders_stayed(sent, state, c))

    stop = threading.Event()
    rounds = [0]  # batches the source has sent since the stream started

    def keep_changing() -> None:  # the source keeps updating everyone, the erased customer too
        while not stop.wait(2):
            batch = source.changes(keyed(WorkloadConfig(seed=80, changes=30, delete_fraction=0.0)))
            batch += source.update("customers", victim, {"full_name": f"Quentin Resurrected {len(sent)}"})
            lake.produce(batch)
            rounds[0] += 1

    log_path = tmp_path / "ingest.log"
    producer = threading.Thread(target=keep_changing, daemon=True)
    erase_log = tmp_path / "erase.log"
    try:
        with running_ingest(env, log_path, trigger_seconds=5) as ingest:
            run_etl(Lake.at(root, spark))
            producer.start()
            # In this process (its Spark session is warm); the stream is the other writer, in its own.
            with erase_log.open("w") as err:  # a file: a slow or stuck erasure shows how far it got
                certificate = erase(Lake.at(root, spark), parse_request([victim], "REQ-LIVE", "operator"),
                                    bootstrap=lake.bootstrap, progress=lambda line: print(line, file=err, flush=True))
            assert certificate.verified, certificate.verification.failures
            assert ingest.poll() is None, "ingest died beside the erasure: " + log_path.read_text()[-3000:]
            # More changes of the erased customer arrive after the erasure.
            after = rounds[0] + 2
            wait_while_running(lambda: rounds[0] >= after, ingest, log_path, poll=0.5)
            stop.set()
            producer.join()
            orders = orders_of(sent, {victim})
            expected, lsns = erased_model(sent, {victim}, orders)
            wait_while_running(lambda: bronze_as_model(root) == expected, ingest, log_path)
    finally:
        stop.set()
    assert_bronze_equals_model(spark, root, expected, lsns)
    run_etl(Lake.at(root, spark))
    assert_lake_equals_model(spark, root, expected)
    texts = texts_of(sent, {victim})
    assert any("Resurrected" in t for t in texts)
    report = scan_lake(Lake.at(root, spark), Subject(frozenset({victim}), frozenset(orders), frozenset(texts)))
    assert report.clean, report.findings[:5]

