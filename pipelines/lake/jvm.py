"""The driver's py4j handles on the JVM, for the code that calls Hadoop, Hudi and Java classes directly.

PySpark declares them on `SparkContext` as optional class attributes (None before the first context
starts); every caller here holds a started context or session, where they are always set. PySpark is
imported only when a handle is asked for: modules that the Airflow workers import (without PySpark)
import this one too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkContext


def jvm_of(context: SparkContext) -> Any:
    """The JVM view of a started context: `jvm_of(sc).org.apache.hudi...` (py4j resolves names at run time)."""
    view = context._jvm
    assert view is not None, "a started SparkContext has its JVM view"
    return view


def driver_gateway() -> Any:
    """The py4j gateway (a JavaGateway) of the driver JVM this process started with its SparkContext."""
    from pyspark import SparkContext

    started = SparkContext._gateway
    assert started is not None, "a started SparkContext has its gateway"
    return started
