"""What a bronze writer knows of its tables between batches (`KnownRows`), against a plain-Python fold."""

from __future__ import annotations

import random

from pipelines import hudi_timeline
from pipelines.hudi_timeline import is_torn
from pipelines.ingest.state import KnownRows, live_rows, newest_deletes


def test_known_rows_follow_upserts_deletes_and_reinserts_across_many_pieces(spark, monkeypatch) -> None:
    """Each piece is one batch's writes to main; the lookup must say what main holds, before and after merging."""
    monkeypatch.setattr(KnownRows, "MAX_PIECES", 3)  # merge the pieces several times during the test
    rng = random.Random(5)
    start = [(k, 10 * k, True) for k in range(0, 40, 2)]
    truth = {k: lsn for k, lsn, _ in start}
    loads = []

    def load():
        loads.append(1)
        return spark.createDataFrame(start, "id long, _lsn long, _live boolean")

    main = KnownRows(load, live_rows)
    lsn = 1_000
    for _ in range(6):
        piece = []
        for key in rng.sample(range(50), 12):
            lsn += 1
            live = rng.random() < 0.6
            piece.append((key, lsn, live))
            if live:
                truth[key] = lsn
            else:
                truth.pop(key, None)
        main.add(spark.createDataFrame(piece, "id long, _lsn long, _live boolean"))
        assert {r["id"]: r["_lsn"] for r in main.all().collect()} == truth
        keys = spark.createDataFrame([(k,) for k in range(0, 50, 3)], "id long")
        assert {r["id"]: r["_lsn"] for r in main.lookup(keys).collect()} == {
            k: v for k, v in truth.items() if k % 3 == 0}
    assert len(loads) == 1, "the tables are read once per writer"


def test_known_deletes_keep_the_newest_per_key(spark) -> None:
    deletes = KnownRows(lambda: spark.createDataFrame([(1, 5), (1, 9), (2, 3)], "id long, _lsn long"),
                        newest_deletes)
    deletes.add(spark.createDataFrame([(2, 7), (3, 1)], "id long, _lsn long"))
    keys = spark.createDataFrame([(1,), (2,), (4,)], "id long")
    assert sorted(tuple(r) for r in deletes.lookup(keys).collect()) == [(1, 9), (2, 7)]


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


def test_a_commit_file_cut_short_is_torn_and_a_whole_one_is_not() -> None:
    """`is_torn`, which decides which timeline file a restart removes (hudi_timeline.repair_torn_timeline)."""
    whole = _avro_container([b"x" * 300])
    assert not is_torn(whole)
    assert is_torn(b"")
    assert [c for c in range(len(whole)) if not is_torn(whole[:c])] == []
    assert not is_torn(b'{"not": "avro"}')


def test_repair_steps_back_each_instant_whose_newest_file_a_crash_cut(tmp_path, monkeypatch) -> None:
    """`repair_torn_timeline` on a local table: a cut completed file, plan or inflight goes; whole and empty stay."""
    monkeypatch.setattr(hudi_timeline.time, "sleep", lambda _s: None)  # no live writer here
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
        "metadata/.hoodie/timeline/8_9.deltacommit": b"",  # the metadata table's: an empty completed file
    }
    for name, data in files.items():
        (table / ".hoodie" / name).parent.mkdir(parents=True, exist_ok=True)
        (table / ".hoodie" / name).write_bytes(data)
    (table / ".hoodie" / "timeline" / ".3_4.deltacommit.crc").write_bytes(b"crc")
    (table / ".hoodie" / "timeline" / "history").mkdir()

    hudi_timeline.repair_torn_timeline(str(table))
    left = {str(p.relative_to(table / ".hoodie")) for p in (table / ".hoodie").rglob("*") if p.is_file()}
    gone = {"timeline/3_4.deltacommit", "timeline/.3_4.deltacommit.crc", "timeline/5.clean.requested",
            "timeline/6.compaction.inflight", "metadata/.hoodie/timeline/8_9.deltacommit"}
    assert left == set(files) - gone
    hudi_timeline.repair_torn_timeline(str(table))  # nothing more to do
    assert {str(p.relative_to(table / ".hoodie")) for p in (table / ".hoodie").rglob("*") if p.is_file()} == left
