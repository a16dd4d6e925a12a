"""Gold: `gold/customer_ltv` and `gold/daily_revenue`, kept exact from silver's change feed.

A cycle touches only the customers and days its changes reach, through one internal
table, `gold/_customer_orders`: per customer id, the silver country (null when the
customer is not in silver) and the counted orders (status not cancelled or refunded),
orders of unknown customers included. Then:

- a changed order moves between at most two customers' rows (its before and after
  images), a changed customer only its own row: the new rows are the old rows of the
  touched customers, read by key, with the changed orders taken out and their new
  versions put in (set semantics by order id, so a replayed window changes nothing);
- `customer_ltv` is a projection of each changed state row that has a country;
- `daily_revenue` is updated by (after - before) of each changed state row, the
  images coming from the state table's CDC feed: a country change moves all of the
  customer's orders from one (day, country) to another without reading those days.

Each table keeps the checkpoint of what it consumed in its own commits (as silver does),
so a cycle killed between two gold commits resumes where each table stands. A table with
no checkpoint, or whose checkpoint is older than its source's active timeline, is rebuilt
from a full read, and the cycle logs it.
"""

from __future__ import annotations

import logging

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.lake.catalog import gold_options
from pipelines.lake.frames import materialized
from pipelines.lake.hudi_timeline import checkpoint, consumed
from pipelines.lake.layout import DELETED_FLAG, gold_path
from pipelines.lake.table_stats import has_completed_commit
from pipelines.runtime import console
from pipelines.transform.changes import Window, cdc_last_ops, cdc_window, keyed_read, window
from pipelines.transform.writes import write_with_checkpoint

log = logging.getLogger(__name__)

NOT_COUNTED = ("cancelled", "refunded")
UNKNOWN_COUNTRY = "??"
# State key of orders without a customer id (ids of the source are positive).
NO_CUSTOMER = -1
MONEY = "decimal(18,2)"
STATE = "_customer_orders"
LTV = "customer_ltv"
DAILY = "daily_revenue"
DAILY_KEY = ("order_date", "country", "currency")

ORDER_FACT = "struct<id:bigint,order_date:date,currency:string,amount_cents:bigint,created_at:timestamp>"
# A state row as Hudi's CDC images spell it in JSON: dates as epoch days, timestamps as epoch micros.
_STATE_JSON = ("struct<customer_id:bigint,country:string,orders:array<struct<id:bigint,order_date:int,"
               "currency:string,amount_cents:bigint,created_at:bigint>>>")
# The silver order columns gold reads, for a cycle that has none to read.
_ORDERS_SCHEMA = ("id long, customer_id long, status string, currency string, amount decimal(12,2), "
                  "order_date date, created_at timestamp")


# ---------------------------------------------------------------- pure transformations


def order_facts(orders: DataFrame) -> DataFrame:
    """(customer_id, order) of each silver order that gold counts."""
    return orders.filter(~F.col("status").isin(*NOT_COUNTED)).select(
        F.coalesce(F.col("customer_id"), F.lit(NO_CUSTOMER)).alias("customer_id"),
        F.struct(F.col("id"), "order_date", "currency", (F.col("amount") * 100).cast("long").alias("amount_cents"),
                 "created_at").alias("order"))


def _no_orders() -> Column:
    return F.array().cast(f"array<{ORDER_FACT}>")


def _grouped(facts: DataFrame) -> DataFrame:
    return facts.groupBy("customer_id").agg(F.array_sort(F.collect_list("order")).alias("orders"))


def build_state(customers: DataFrame, orders: DataFrame) -> DataFrame:
    """State rows from full silver tables."""
    people = customers.select(F.col("id").alias("customer_id"), "country")
    joined = people.join(_grouped(order_facts(orders)), "customer_id", "full_outer")
    return joined.select("customer_id", "country", F.coalesce("orders", _no_orders()).alias("orders"))


def advance_state(old: DataFrame, customers: DataFrame, orders: DataFrame, touched: DataFrame) -> DataFrame:
    """New state rows of every customer a window touched, `_hoodie_is_deleted` where nothing is left.

    old: current state rows (at least those of the touched customers);
    customers: (customer_id, country) of each changed customer, country null if it left silver;
    orders: silver rows of the changed orders that are live;
    touched: (customer_id, order_id) from every before and after image of the changed orders.
    """
    affected = touched.select("customer_id").unionByName(customers.select("customer_id")).distinct()
    changed = touched.select(F.col("order_id").alias("_oid")).distinct()
    kept = (old.join(affected, "customer_id", "left_semi")
            .select("customer_id", F.explode("orders").alias("order"))
            .withColumn("_oid", F.col("order.id")).join(changed, "_oid", "left_anti").drop("_oid"))
    facts = _grouped(kept.unionByName(order_facts(orders)))
    rows = (affected
            .join(old.select("customer_id", F.col("country").alias("_old")), "customer_id", "left")
            .join(customers.select("customer_id", F.col("country").alias("_new"), F.lit(True).alias("_changed")),
                  "customer_id", "left")
            .join(facts, "customer_id", "left"))
    country = F.when(F.col("_changed"), F.col("_new")).otherwise(F.col("_old"))
    orders_col = F.coalesce(F.col("orders"), _no_orders())
    return rows.select("customer_id", country.alias("country"), orders_col.alias("orders"),
                       (country.isNull() & (F.size(orders_col) == 0)).alias(DELETED_FLAG))


def customer_ltv(state: DataFrame) -> DataFrame:
    """customer_ltv rows of state rows; `_hoodie_is_deleted` for those not in silver."""
    cents = F.aggregate("orders", F.lit(0).cast("long"), lambda acc, o: acc + o["amount_cents"])
    times = F.transform("orders", lambda o: o["created_at"])
    return state.select(
        "customer_id", "country", F.size("orders").cast("long").alias("orders_count"),
        (cents.cast("decimal(20,0)") / 100).cast(MONEY).alias("total_amount"),
        F.array_min(times).alias("first_order_at"), F.array_max(times).alias("last_order_at"),
        F.col("country").isNull().alias(DELETED_FLAG))


def revenue(state: DataFrame) -> DataFrame:
    """(order_date, country, currency, orders_count, revenue_cents) summed over state rows."""
    orders = state.select(F.coalesce("country", F.lit(UNKNOWN_COUNTRY)).alias("country"),
                          F.explode("orders").alias("o"))
    return orders.groupBy(F.col("o.order_date").alias("order_date"), "country", F.col("o.currency").alias("currency")) \
        .agg(F.count("*").alias("orders_count"), F.sum("o.amount_cents").alias("revenue_cents"))


def revenue_delta(before: DataFrame, after: DataFrame) -> DataFrame:
    """after - before per daily_revenue key, only where something moved."""
    minus = revenue(before).select(*DAILY_KEY, (-F.col("orders_count")).alias("orders_count"),
                                   (-F.col("revenue_cents")).alias("revenue_cents"))
    summed = revenue(after).unionByName(minus).groupBy(*DAILY_KEY) \
        .agg(F.sum("orders_count").alias("d_count"), F.sum("revenue_cents").alias("d_cents"))
    return summed.filter((F.col("d_count") != 0) | (F.col("d_cents") != 0))


def daily_rows(agg: DataFrame) -> DataFrame:
    """daily_revenue rows from (keys, orders_count, revenue_cents); `_hoodie_is_deleted` where none is left."""
    return agg.select(*DAILY_KEY, F.col("orders_count").cast("long").alias("orders_count"),
                      (F.col("revenue_cents").cast("decimal(20,0)") / 100).cast(MONEY).alias("revenue"),
                      (F.col("orders_count") == 0).alias(DELETED_FLAG))


def apply_delta(current: DataFrame, delta: DataFrame) -> DataFrame:
    """New daily_revenue rows of the keys in `delta`, given the current rows of (at least) their days."""
    cur = current.select(*DAILY_KEY, "orders_count", (F.col("revenue") * 100).cast("long").alias("cents"))
    joined = delta.join(cur, list(DAILY_KEY), "left")
    return daily_rows(joined.select(
        *DAILY_KEY, (F.coalesce("orders_count", F.lit(0)) + F.col("d_count")).alias("orders_count"),
        (F.coalesce("cents", F.lit(0)) + F.col("d_cents")).alias("revenue_cents")))


def state_images(cdc: DataFrame) -> DataFrame:
    """(customer_id, before, after) per changed state row: the first before and last after image of the window."""
    def parse(column: str) -> Column:
        image = F.from_json(F.col(column), _STATE_JSON)
        orders = F.transform(image["orders"], lambda o: F.struct(
            o["id"].alias("id"), F.date_from_unix_date(o["order_date"]).alias("order_date"),
            o["currency"].alias("currency"), o["amount_cents"].alias("amount_cents"),
            F.timestamp_micros(o["created_at"]).alias("created_at")))
        # The absent image is the JSON text 'null', which from_json turns into a struct of nulls.
        return F.when(F.col(column) != "null", F.struct(image["customer_id"].alias("customer_id"),
                                                       image["country"].alias("country"), orders.alias("orders")))

    keyed = cdc.select(F.coalesce(F.get_json_object("before", "$.customer_id"),
                                  F.get_json_object("after", "$.customer_id")).cast("long").alias("customer_id"),
                       "ts_ms", parse("before").alias("before"), parse("after").alias("after"))
    # Aggregated straight off the CDC reader (see changes.cdc_window: no window, no sort).
    return keyed.groupBy("customer_id").agg(F.min_by("before", "ts_ms").alias("before"),
                                            F.max_by("after", "ts_ms").alias("after"))


# ---------------------------------------------------------------- cycles (read, compute, write)


def _with_stale_deletes(spark: SparkSession, path: str, rows: DataFrame, key: list[str]) -> DataFrame:
    """A full rebuild's rows plus deletes of the keys the table holds and the rebuild does not."""
    if not has_completed_commit(path):
        return rows
    stale = spark.read.format("hudi").load(path).select(*key).join(rows.select(*key), key, "left_anti")
    return rows.unionByName(stale.withColumn(DELETED_FLAG, F.lit(True)), allowMissingColumns=True)


def _read_all(spark: SparkSession, w: Window) -> DataFrame | None:
    return spark.read.format("hudi").load(w.path) if w.until else None


def state_cycle(spark: SparkSession, root: str, silver_customers: str, silver_orders: str) -> dict[str, int]:
    out = gold_path(STATE, root)
    marks = checkpoint(spark, out) if has_completed_commit(out) else {}
    cust_w, ord_w = window(spark, silver_customers, consumed(marks, silver_customers)), \
        window(spark, silver_orders, consumed(marks, silver_orders))
    if cust_w.empty and ord_w.empty:
        return {}
    new_marks = {w.path: w.until for w in (cust_w, ord_w) if w.until}
    if not has_completed_commit(out) or cust_w.full or ord_w.full or cust_w.since is None or ord_w.since is None:
        if has_completed_commit(out):
            log.warning("%s: rebuilding from full reads of silver", out)
        customers = _read_all(spark, cust_w)
        orders = _read_all(spark, ord_w)
        customers = customers if customers is not None else spark.createDataFrame([], "id long, country string")
        orders = orders if orders is not None else spark.createDataFrame([], _ORDERS_SCHEMA)
        rows = _with_stale_deletes(spark, out, build_state(customers, orders).withColumn(DELETED_FLAG, F.lit(False)),
                                   ["customer_id"])
        write_with_checkpoint(rows, out, gold_options(STATE), new_marks)
        return {"rebuilt": 1}

    # Which customers and orders changed comes from silver's CDC feed (for an order, under
    # which customer it was before and is now); their current rows are read by key.
    customers = spark.createDataFrame([], "customer_id long, country string")
    if not cust_w.empty:
        changed = cdc_last_ops(spark, cust_w, ("id",)).select(F.col("id").alias("customer_id"))
        now = keyed_read(spark, silver_customers, changed.withColumnRenamed("customer_id", "id"))
        customers = changed.join(now.select(F.col("id").alias("customer_id"), "country"), "customer_id", "left")
    touched = spark.createDataFrame([], "customer_id long, order_id long")
    orders = spark.createDataFrame([], _ORDERS_SCHEMA)
    if not ord_w.empty:
        images = cdc_window(spark, ord_w)
        touched = materialized(images.select(F.explode(F.array(*[
            F.struct(F.get_json_object(image, "$.customer_id").cast("long").alias("customer_id"),
                     F.get_json_object(image, "$.id").cast("long").alias("order_id"))
            for image in ("before", "after")])).alias("t")) \
            .select("t.*").filter(F.col("order_id").isNotNull()) \
            .withColumn("customer_id", F.coalesce("customer_id", F.lit(NO_CUSTOMER))).distinct())
        orders = keyed_read(spark, silver_orders, touched.select(F.col("order_id").alias("id")).distinct()) \
            .select(*[c.split()[0] for c in _ORDERS_SCHEMA.split(", ")])
    # Each input is read once: the write evaluates its input several times, and every
    # evaluation would read silver's files again. Checkpoints rather than cached plans:
    # Spark infers a filter from the keyed read's key list for every input of the join, and
    # pushed into a cached plan that filter grows deep enough to overflow the stack.
    customers, orders = (materialized(df) for df in (customers, orders))
    keys = touched.select("customer_id").unionByName(customers.select("customer_id"))
    old = keyed_read(spark, out, keys).select("customer_id", "country", "orders")
    rows = advance_state(old, customers, orders, touched)
    write_with_checkpoint(rows, out, gold_options(STATE), new_marks)
    return {"customers": keys.distinct().count(), "orders": touched.select("order_id").distinct().count()}


def _state_window(spark: SparkSession, out: str, state: str) -> tuple[Window, bool] | None:
    """The window of the state table a gold table still has to consume and whether to rebuild; None if nothing to do."""
    marks = checkpoint(spark, out) if has_completed_commit(out) else {}
    w = window(spark, state, consumed(marks, state))
    rebuild = not has_completed_commit(out) or w.full or w.since is None
    if w.until is None or (w.empty and not rebuild):
        return None
    if rebuild and has_completed_commit(out):
        log.warning("%s: rebuilding from a full read of %s", out, state)
    return w, rebuild


def ltv_cycle(spark: SparkSession, root: str) -> dict[str, int]:
    out, state = gold_path(LTV, root), gold_path(STATE, root)
    if (todo := _state_window(spark, out, state)) is None:
        return {}
    w, rebuild = todo
    if rebuild:
        rows = customer_ltv(spark.read.format("hudi").load(state)).filter(~F.col(DELETED_FLAG))
        rows = _with_stale_deletes(spark, out, rows, ["customer_id"])
    else:
        images = state_images(cdc_window(spark, w))
        after = images.select("customer_id", F.col("after.country").alias("country"),
                              F.coalesce(F.col("after.orders"), _no_orders()).alias("orders"))
        rows = materialized(customer_ltv(after))  # read the feed once, not once per evaluation
    write_with_checkpoint(rows, out, gold_options(LTV), {state: w.end})
    return {"rebuilt": 1} if rebuild else {"customers": rows.count()}


def daily_cycle(spark: SparkSession, root: str) -> dict[str, int]:
    out, state = gold_path(DAILY, root), gold_path(STATE, root)
    if (todo := _state_window(spark, out, state)) is None:
        return {}
    w, rebuild = todo
    if rebuild:
        rows = _with_stale_deletes(spark, out, daily_rows(revenue(spark.read.format("hudi").load(state))),
                                   list(DAILY_KEY))
        write_with_checkpoint(rows, out, gold_options(DAILY), {state: w.end})
        return {"rebuilt": 1}
    images = state_images(cdc_window(spark, w)).persist()
    part = "customer_id", "country", "orders"
    before = images.filter(F.col("before").isNotNull()).select(*[F.col(f"before.{c}") for c in part])
    after = images.filter(F.col("after").isNotNull()).select(*[F.col(f"after.{c}") for c in part])
    delta = revenue_delta(before, after).persist()
    try:
        days = [r[0] for r in delta.select("order_date").distinct().collect()]
        current = spark.read.format("hudi").load(out).filter(F.col("order_date").isin(days))
        write_with_checkpoint(apply_delta(current, delta), out, gold_options(DAILY), {state: w.end})
        return {"keys": delta.count(), "days": len(days)}
    finally:
        delta.unpersist()
        images.unpersist()


def gold_cycle(spark: SparkSession, root: str, silver_customers: str, silver_orders: str) -> dict[str, dict[str, int]]:
    """silver -> gold/_customer_orders -> gold/customer_ltv, gold/daily_revenue."""
    steps = {STATE: lambda: state_cycle(spark, root, silver_customers, silver_orders),
             LTV: lambda: ltv_cycle(spark, root), DAILY: lambda: daily_cycle(spark, root)}
    return {name: console.timed(log, f"gold/{name}", run) for name, run in steps.items()}
