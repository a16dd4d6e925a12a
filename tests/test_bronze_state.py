"""What a bronze writer knows of its tables between batches (`KnownRows`), against a plain-Python fold."""

from __future__ import annotations

import random

from pipelines.bronze import KnownRows, live_rows, newest_deletes


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
