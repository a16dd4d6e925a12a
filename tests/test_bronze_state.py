"""What a bronze writer knows of its tables between batches (`KnownRows`), against a plain-Python fold."""

from __future__ import annotations

import random

import pytest

from pipelines.ingest.state import KnownRows, known_rows
from pipelines.lake import timeline_repair
from pipelines.lake.timeline_repair import is_torn


@pytest.mark.integration
def test_known_rows_follow_upserts_deletes_and_reinserts_across_many_pieces(spark, monkeypatch) -> None:
    """Each piece is one batch's commits (change-log deletes, main); a lookup must say what main holds and
    the newest delete applied, per key, as a plain-Python fold of the same writes does, while the pieces
    are merged, among themselves first (a delete there hides a live row of the table read at start), then
    with the table's."""
    monkeypatch.setattr(KnownRows, "FAN_IN", 2)  # tiers of 2: many merges in the test's 12 batches
    rng = random.Random(5)
    main_rows = [(k, 10 * k, True) for k in range(0, 60, 2)]
    ledger = [(k, 10 * k + 3) for k in range(1, 60, 4)] + [(5, 2)]  # two deletes of key 5: the newer counts
    in_main = {k: lsn for k, lsn, _ in main_rows}
    deleted: dict[int, int] = {}
    for k, lsn in ledger:
        deleted[k] = max(deleted.get(k, -1), lsn)
    loads = []

    def load():
        loads.append(1)
        return known_rows(("id",), spark.createDataFrame(main_rows, "id long, _lsn long, _live boolean"),
                          spark.createDataFrame(ledger, "id long, _lsn long"))

    known = KnownRows(load, ("id",))
    lsn = 10_000  # newer than every row of the tables
    added, among_themselves = [], False
    for _ in range(12):
        to_main, to_log = [], []
        for key in rng.sample(range(70), 12):
            lsn += 1
            if rng.random() < 0.6:
                to_main.append((key, lsn, True))
                in_main[key] = lsn
            else:  # a delete: to the change log always, to main when main held the key
                to_log.append((key, lsn))
                deleted[key] = lsn
                if in_main.pop(key, None) is not None:
                    to_main.append((key, lsn, False))
        added.append(len(to_main) + len(to_log))
        known.add(known_rows(("id",), main=spark.createDataFrame(to_main, "id long, _lsn long, _live boolean"),
                             deletes=spark.createDataFrame(to_log, "id long, _lsn long")), added[-1])
        sizes = known.sizes
        assert sum(sizes) == len(main_rows) + len(ledger) + sum(added) and len(sizes) <= 6, sizes
        among_themselves |= sizes[0] == len(main_rows) + len(ledger) and any(n not in added for n in sizes[1:])
        assert {r["id"]: r["_lsn"] for r in known.main().collect()} == in_main
        keys = spark.createDataFrame([(k,) for k in range(0, 70, 3)], "id long")
        expected = {k: (in_main.get(k), deleted.get(k)) for k in range(0, 70, 3) if k in in_main or k in deleted}
        assert {r["id"]: (r["_m_lsn"], r["_t_lsn"]) for r in known.lookup(keys).collect()} == expected
    assert among_themselves and known.sizes[0] > len(main_rows) + len(ledger), \
        "the batches' pieces were merged among themselves, then with the table's"
    assert len(loads) == 1, "the tables are read once per writer"


@pytest.mark.integration
def test_known_rows_of_empty_tables_answer_without_a_join_until_a_batch_adds_rows(spark) -> None:
    """A new lake's first batch looks its keys up in nothing: an empty relation the optimizer folds
    away (no broadcast of the batch's keys); rows added afterwards are found."""
    known = KnownRows(lambda: known_rows(("id",), spark.createDataFrame([], "id long, _lsn long, _live boolean"),
                                         spark.createDataFrame([], "id long, _lsn long")), ("id",))
    keys = spark.createDataFrame([(1,), (2,)], "id long")
    empty = known.lookup(keys)
    assert empty.columns == ["id", "_m_lsn", "_t_lsn"] and empty.collect() == []
    plan = keys.join(empty, "id", "left")._jdf.queryExecution().optimizedPlan().toString()
    assert "Join" not in plan and "Aggregate" not in plan, plan  # the keys with null columns, nothing else
    known.add(known_rows(("id",), main=spark.createDataFrame([(1, 7, True)], "id long, _lsn long, _live boolean")), 1)
    known.add(known_rows(("id",), deletes=spark.createDataFrame([(2, 9)], "id long, _lsn long")), 1)
    assert sorted(tuple(r) for r in known.lookup(keys).collect()) == [(1, 7, None), (2, None, 9)]


def _avro_container(blocks: list[bytes], sync: bytes = bytes(range(16))) -> bytes:
    """An Avro object container as Hudi 1.x writes commit metadata: header (magic, metadata map, sync), blocks."""
    def long(n: int) -> bytes:
        n, out = (n << 1) ^ (n >> 63), b""
        while n > 0x7F:
            out, n = out + bytes([(n & 0x7F) | 0x80]), n >> 7
        return out + bytes([n])

    schema = b'{"type":"record","name":"HoodieCommitMetadata","fields":[]}' * 3
    meta = [(b"avro.schema", schema), (b"avro.codec", b"null")]
    header = b"Obj\x01" + long(len(meta)) + b"".join(long(len(k)) + k + long(len(v)) + v for k, v in meta) + long(0)
    return header + sync + b"".join(long(1) + long(len(b)) + b + sync for b in blocks)


@pytest.mark.unit
def test_a_commit_file_cut_short_is_torn_and_a_whole_one_is_not() -> None:
    """`is_torn`, which decides which timeline file a restart removes (timeline_repair.repair_torn_timeline)."""
    whole = _avro_container([b"x" * 300])
    assert not is_torn(whole)
    assert is_torn(b"")
    assert [c for c in range(len(whole)) if not is_torn(whole[:c])] == []
    assert not is_torn(b'{"not": "avro"}')


@pytest.mark.unit
def test_repair_steps_back_each_instant_whose_newest_file_a_crash_cut(tmp_path, monkeypatch) -> None:
    """`repair_torn_timeline` on a local table: a cut completed file, plan or inflight goes; whole and empty stay."""
    monkeypatch.setattr(timeline_repair.time, "sleep", lambda _s: None)  # no live writer here
    whole = _avro_container([b"x" * 300])
    table = tmp_path / "table"
    files = {
        "timeline/1.deltacommit.requested": b"", "timeline/1.deltacommit.inflight": whole,
        "timeline/1_2.deltacommit": whole,  # whole: stays
        "timeline/3.deltacommit.requested": b"", "timeline/3.deltacommit.inflight": whole,
        "timeline/3_4.deltacommit": whole[:-7],  # completed, cut: the write is inflight again
        "timeline/5.clean.requested": whole[:40],  # a cut plan, nothing started: planned again
        "timeline/6.compaction.requested": whole, "timeline/6.compaction.inflight": whole[:25],  # runs again
        "timeline/7.commit.requested": b"", "timeline/7.inflight": b"",  # empty pending files are Hudi's own
        "timeline/10.compaction.requested": b"",  # but an empty plan is a cut one: planned again
        "metadata/.hoodie/timeline/8_9.deltacommit": b"",  # the metadata table's: an empty completed file
    }
    for name, data in files.items():
        (table / ".hoodie" / name).parent.mkdir(parents=True, exist_ok=True)
        (table / ".hoodie" / name).write_bytes(data)
    (table / ".hoodie" / "timeline" / ".3_4.deltacommit.crc").write_bytes(b"crc")
    (table / ".hoodie" / "timeline" / "history").mkdir()

    timeline_repair.repair_torn_timeline(str(table))
    left = {str(p.relative_to(table / ".hoodie")) for p in (table / ".hoodie").rglob("*") if p.is_file()}
    gone = {"timeline/3_4.deltacommit", "timeline/.3_4.deltacommit.crc", "timeline/5.clean.requested",
            "timeline/10.compaction.requested",
            "timeline/6.compaction.inflight", "metadata/.hoodie/timeline/8_9.deltacommit"}
    assert left == set(files) - gone
    timeline_repair.repair_torn_timeline(str(table))  # nothing more to do
    assert {str(p.relative_to(table / ".hoodie")) for p in (table / ".hoodie").rglob("*") if p.is_file()} == left


@pytest.mark.integration
def test_reads_by_path_leave_no_file_listing_in_the_drivers_shared_cache(spark, tmp_path) -> None:
    """Spark's shared FileStatusCache keeps every read's listing under that read's own key, never read again: in the
    stream's driver it grew by ~10,000 FileStatus objects a minute (hudi_configs/spark.toml). The project's
    sessions have none; a read by path still lists its files."""
    jvm = spark._jvm
    cache = jvm.org.apache.spark.sql.execution.datasources.FileStatusCache.getOrCreate(spark._jsparkSession)
    assert cache.getClass().getName() == "org.apache.spark.sql.execution.datasources.NoopCache$"
    spark.range(3).write.parquet(str(tmp_path / "t"))
    assert spark.read.parquet(str(tmp_path / "t")).count() == 3
