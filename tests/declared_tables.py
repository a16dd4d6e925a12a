"""A declared workload beyond the shop: two tables of every type of contract section 7 and a composite key,
their declaration, and the plain-Python model of silver after its cleaning and rules.

The envelopes (with their Connect schema, `schemas.enable=true`) and the model of the source come from
lakehouse_dev.generator.declared_envelopes, built independently of the pipeline's parser.
"""

from __future__ import annotations

import random
import re
from typing import Any

from lakehouse_dev.generator.declared_envelopes import (
    PREFIX,
    TEXTS,
    TYPES,
    DeclaredSource,
    DeclaredTable,
    random_values,
    unchanged,
)

__all__ = ["DECLARATION", "EVERY_TYPE", "LINES", "DeclaredSource", "DeclaredTable", "silver_model"]


def _every_type(rng: random.Random, _: dict[str, Any]) -> dict[str, Any]:
    return random_values(rng, TYPES)


def _line(rng: random.Random, _: dict[str, Any]) -> dict[str, Any]:
    return {"label": rng.choice(TEXTS), "num": rng.randint(0, 50)}


EVERY_TYPE = DeclaredTable("every_type", ("id",), [("id", {"type": "int64"}, unchanged), *TYPES.values()], _every_type)
LINES = DeclaredTable("order_lines", ("region", "order_no"),
                      [("region", {"type": "string"}, unchanged), ("order_no", {"type": "int64"}, unchanged),
                       TYPES["label"], TYPES["num"]], _line)

DECLARATION = f"""
[source]
topic_prefix = "{PREFIX}"

[tables.every_type]
source = "public.every_type"
key = ["id"]

[[tables.every_type.clean]]
column = "label"
trim = true
upper = true
[[tables.every_type.rules]]
column = "mood"
one_of = ["happy"]
[[tables.every_type.rules]]
column = "price"
min = 0
name = "price_not_negative"
[[tables.every_type.rules]]
column = "label"
pattern = "^[A-Z ]+$"
[[tables.every_type.rules]]
column = "flag"
not_null = true

[tables.order_lines]
source = "public.order_lines"
key = ["region", "order_no"]

[[tables.order_lines.rules]]
column = "num"
max = 40
"""


def silver_model(table: str, row: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the row after DECLARATION's cleaning, the first of its rules the row fails), in plain Python: a NULL passes
    every rule but not_null; `pattern` is found anywhere; trim strips whitespace, then upper."""
    if table == "order_lines":
        return row, ("num_max" if row["num"] is not None and row["num"] > 40 else None)
    label = row["label"].strip().upper() if row["label"] is not None else None
    clean = {**row, "label": label}
    checks = [("mood_one_of", row["mood"] is None or row["mood"] == "happy"),
              ("price_not_negative", row["price"] is None or row["price"] >= 0),
              ("label_pattern", label is None or re.search(r"^[A-Z ]+$", label) is not None),
              ("flag_not_null", row["flag"] is not None)]
    return clean, next((name for name, ok in checks if not ok), None)
