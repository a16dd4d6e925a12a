"""What the real Debezium 2.7.3 connector emits for section 7's types (tests/fixtures/declared/, captured by
tests/declared_capture.py): the Connect schemas' semantic names and parameters, and the shape of the
events the lake must handle (composite keys, a key update, incremental snapshots). No Spark, no
services: a Debezium upgrade or a connector setting that changes any of it fails here first.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).with_name("fixtures") / "declared"
SCENARIOS = ("snapshot", "insert", "update", "nulls", "unicode", "dates", "bytea", "arrays", "numerics", "delete",
             "composite_insert", "composite_update", "composite_key_update", "composite_delete",
             "incremental_snapshot", "signal_table")
PROPAGATED = ("__debezium.source.column.type", "__debezium.source.column.length", "__debezium.source.column.scale")

# Column -> (Connect type, semantic name, items' type): the contract's section 7 as 2.7.3 spells it.
ALL_TYPES = {
    "id": ("int64", None, None),
    "c_smallint": ("int16", None, None),
    "c_integer": ("int32", None, None),
    "c_bigint": ("int64", None, None),
    "c_real": ("float", None, None),
    "c_double": ("double", None, None),
    "c_boolean": ("boolean", None, None),
    "c_numeric": ("string", None, None),
    "c_numeric_any": ("string", None, None),
    "c_text": ("string", None, None),
    "c_varchar": ("string", None, None),
    "c_char": ("string", None, None),
    "c_enum": ("string", "io.debezium.data.Enum", None),
    "c_date": ("int32", "io.debezium.time.Date", None),
    "c_timestamp": ("int64", "io.debezium.time.MicroTimestamp", None),
    "c_timestamp3": ("int64", "io.debezium.time.Timestamp", None),  # timestamp(0-3): milliseconds
    "c_timestamptz": ("string", "io.debezium.time.ZonedTimestamp", None),
    "c_uuid": ("string", "io.debezium.data.Uuid", None),
    "c_json": ("string", "io.debezium.data.Json", None),
    "c_jsonb": ("string", "io.debezium.data.Json", None),
    "c_bytea": ("bytes", None, None),
    "c_text_array": ("array", None, "string"),
    "c_int_array": ("array", None, "int32"),
}


def records(scenario: str) -> list[dict[str, Any]]:
    doc = json.loads((FIXTURES / f"{scenario}.json").read_text(encoding="utf-8"))
    assert doc["scenario"] == scenario and doc["records"], f"{scenario}: no records"
    return doc["records"]


def wrapped(record: dict[str, Any]) -> dict[str, Any] | None:
    return None if record["value"] is None else json.loads(record["value"])


def envelope(record: dict[str, Any]) -> dict[str, Any] | None:
    doc = wrapped(record)
    return None if doc is None else doc["payload"]


def image_fields(record: dict[str, Any], image: str = "after") -> dict[str, dict[str, Any]]:
    schema = wrapped(record)["schema"]
    assert schema["name"].endswith(".Envelope")
    fields = next(f for f in schema["fields"] if f["field"] == image)["fields"]
    return {f["field"]: f for f in fields}


def all_records() -> list[dict[str, Any]]:
    return [r for s in SCENARIOS for r in records(s)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_record_is_a_wrapped_envelope(scenario: str) -> None:
    for r in records(scenario):
        assert isinstance(json.loads(r["key"]), dict)  # keys without schema, as the contract's
        doc = wrapped(r)
        if doc is None:
            continue
        assert set(doc) == {"schema", "payload"}
        env = doc["payload"]
        assert {"before", "after", "source", "op", "ts_ms", "transaction"} <= set(env)
        assert env["op"] in ("r", "c", "u", "d")
        source = env["source"]
        assert source["connector"] == "postgresql" and source["version"] == "2.7.3.Final"
        if source["snapshot"] == "incremental":
            # An incremental snapshot's read has no LSN and no transaction: its place in the stream
            # is `source.sequence`, [last committed LSN, LSN] of where the stream was when it was read.
            assert source["lsn"] is None and source["txId"] is None
            assert all(int(p) > 0 for p in json.loads(source["sequence"]))
        else:
            assert isinstance(source["lsn"], int) and isinstance(source["txId"], int)
        assert r["topic"] == f"shop.{source['schema']}.{source['table']}"


def test_section_7_types_have_their_semantic_names() -> None:
    seen = 0
    for r in all_records():
        if r["topic"] != "shop.public.all_types" or r["value"] is None:
            continue
        for image in ("before", "after"):
            fields = image_fields(r, image)
            assert list(fields) == list(ALL_TYPES), "the columns, in table order"
            got = {c: (f["type"], f.get("name"), (f.get("items") or {}).get("type")) for c, f in fields.items()}
            assert got == ALL_TYPES
            assert all(f["optional"] for c, f in fields.items() if c != "id")
            assert fields["c_enum"]["parameters"]["allowed"] == "happy,sad,ok"
            assert all(f["items"]["optional"] for f in fields.values() if f["type"] == "array")
        seen += 1
    assert seen >= 15


def test_numerics_carry_their_precision_and_scale() -> None:
    """datatype.propagate.source.type: numeric(p,s) says p and s; an unconstrained numeric says no usable scale,
    and says it differently in the snapshot (length 0, no scale) and in the stream (pgoutput: length
    131089, scale 0); neither is a precision a decimal type can take."""
    snapshot_any, stream_any = set(), set()
    for r in all_records():
        if r["value"] is None or r["topic"] not in ("shop.public.all_types", "shop.sales.regional_orders"):
            continue
        fields = image_fields(r)
        in_snapshot = envelope(r)["op"] == "r"
        if r["topic"] == "shop.sales.regional_orders":
            assert {k: fields["amount"]["parameters"][k] for k in PROPAGATED} == \
                dict(zip(PROPAGATED, ("NUMERIC", "10", "3"), strict=True))
            continue
        assert {k: fields["c_numeric"]["parameters"][k] for k in PROPAGATED} == \
            dict(zip(PROPAGATED, ("NUMERIC", "12", "2"), strict=True))
        params = fields["c_numeric_any"]["parameters"]
        assert params["__debezium.source.column.type"] == "NUMERIC"
        (snapshot_any if in_snapshot else stream_any).add(
            (params["__debezium.source.column.length"], params.get("__debezium.source.column.scale")))
        assert not any("parameters" in f for c, f in fields.items() if c not in ("c_numeric", "c_numeric_any",
                                                                                   "c_enum"))
    assert snapshot_any == {("0", None)}
    assert stream_any == {("131089", "0")}
    values = {envelope(r)["after"]["id"]: envelope(r)["after"] for r in records("numerics")}
    assert values[19]["c_numeric"] == "9999999999.99"
    assert values[19]["c_numeric_any"] == "-0.000000000000000000000000000000000000001"
    assert values[20]["c_numeric"] == "5.00" and values[20]["c_numeric_any"] == "NAN"
    big = next(envelope(r)["after"] for r in records("snapshot") if r["key"] == '{"id":3}')
    assert big["c_numeric_any"] == "123456789012345678901234567890.123456789"


def test_values_as_the_wire_carries_them() -> None:
    after = {envelope(r)["after"]["id"]: envelope(r)["after"] for r in all_records()
             if r["topic"] == "shop.public.all_types" and r["value"] and envelope(r)["after"]}
    typical = after[1]
    assert typical["c_date"] == 20513  # 2026-03-01, days since the epoch
    assert typical["c_timestamp"] == 1772360130123456  # wall clock 2026-03-01 10:15:30.123456, microseconds
    assert typical["c_timestamp3"] == 1772360130123
    assert typical["c_timestamptz"] is None or typical["c_timestamptz"].endswith("Z")
    assert json.loads(typical["c_jsonb"]) == {"a": "x", "b": [1, 2]}
    # Pre-1970 and far-future dates and timestamps.
    early = after[13]
    assert (early["c_date"], early["c_timestamp"], early["c_timestamp3"]) == (-719162, -2208988799999999, -1)
    assert after[13]["c_timestamptz"] == "1950-06-15T10:00:00.000000Z"
    assert (after[14]["c_date"], after[14]["c_timestamp"]) == (2932896, 32503679999123456)
    assert after[14]["c_timestamptz"] == "2999-12-31T23:59:59.999999Z"
    # bytea: base64 of the bytes, zero bytes included; an empty value is "".
    assert base64.b64decode(after[15]["c_bytea"]) == b"\x00\xff\x00\x00\x00" and after[16]["c_bytea"] == ""
    # Arrays: JSON arrays, a NULL element as null.
    assert after[17]["c_text_array"] == ["a", None, "c"] and after[17]["c_int_array"] == [1, None, 3]
    assert after[18]["c_text_array"] == [] and after[18]["c_int_array"] == []
    # Unicode text as UTF-8 JSON strings; char(n) padded by the database.
    assert after[12]["c_text"] == 'Zoë 🎉 日本語 "quoted" back\\slash' and after[12]["c_char"] == "é✓x"
    assert base64.b64decode(after[12]["c_bytea"]).decode() == "Zoë"
    # A row of NULLs: every nullable column null.
    assert all(v is None for c, v in after[11].items() if c != "id")


def test_deletes_and_key_updates() -> None:
    delete = records("delete")
    assert [envelope(r) and envelope(r)["op"] for r in delete] == ["d", None]
    assert delete[0]["key"] == delete[1]["key"] == '{"id":10}' and delete[0]["partition"] == delete[1]["partition"]
    before = envelope(delete[0])["before"]
    assert before["id"] == 10 and all(v is None for c, v in before.items() if c != "id")  # REPLICA IDENTITY DEFAULT

    # An update of a key column: delete of the old key, its tombstone, create of the new key, one transaction.
    moved = records("composite_key_update")
    by_op = sorted(((envelope(r) or {}).get("op", "tombstone"), r["key"]) for r in moved)
    old, new = '{"region":"eu","order_no":1}', '{"region":"emea","order_no":1}'
    assert by_op == [("c", new), ("d", old), ("tombstone", old)]
    envs = [envelope(r) for r in moved if r["value"]]
    assert len({e["source"]["txId"] for e in envs}) == 1
    delete_env = next(e for e in envs if e["op"] == "d")
    # A NOT NULL column of a delete's `before` is not null but its type's zero: the field is required.
    assert delete_env["before"] == {"region": "eu", "order_no": 1, "amount": "0.000", "note": None}
    # Keys: every primary-key column, in the key's order.
    assert all(list(json.loads(r["key"])) == ["region", "order_no"] for r in all_records()
               if r["topic"] == "shop.sales.regional_orders")


def test_incremental_snapshot_of_a_table_added_by_sync() -> None:
    got = records("incremental_snapshot")
    envs = [envelope(r) for r in got]
    reads = [e for e in envs if e["op"] == "r"]
    assert sorted(e["after"]["id"] for e in reads) == [1, 2, 3]
    assert all(e["source"]["snapshot"] == "incremental" and e["before"] is None for e in reads)
    after_sync = [e for e in envs if e["op"] == "c"]
    assert [e["after"]["id"] for e in after_sync] == [4] and after_sync[0]["source"]["snapshot"] == "false"
    # The initial snapshot's reads never say "incremental"; with several tables, 2.7 marks each
    # table's first and last row besides the snapshot's.
    assert {envelope(r)["source"]["snapshot"] for r in records("snapshot")} == \
        {"first", "first_in_data_collection", "true", "last_in_data_collection", "last"}
    # The signal table's topic: the execute-snapshot row, then an open and a close watermark per chunk.
    signals = [envelope(r)["after"] for r in records("signal_table")]
    kinds = sorted(s["type"] for s in signals)
    assert kinds.count("execute-snapshot") == 1
    assert kinds.count("snapshot-window-open") == kinds.count("snapshot-window-close") >= 1
    request = next(s for s in signals if s["type"] == "execute-snapshot")
    assert json.loads(request["data"]) == {"data-collections": [r"public\.late_rows"], "type": "incremental"}
