"""`lakehouse gdpr`: file erasure requests, and erase them (contract section 4).

Importing this module imports no Spark: the erasure's Spark work is imported when a command runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TextIO

import click

from pipelines.errors import InvalidRequest
from pipelines.gdpr import inbox
from pipelines.gdpr.request import MAX_IDS, ErasureRequest, parse_request, parse_requests
from pipelines.runtime import console
from pipelines.runtime.commands import echo_json, pass_lake
from pipelines.runtime.lake import Lake


@click.group()
def gdpr() -> None:
    """GDPR erasure (contract section 4): `lakehouse gdpr erase`."""


@gdpr.command()
@click.option("--customer-id", "customer_id", multiple=True,
              help="A customer to erase; repeat for several.")
@click.option("--customer-ids", default=None, metavar="ID,ID,...",
              help="Customers to erase, comma-separated.")
@click.option("--customer-ids-file", type=click.File("r"), default=None,
              help="Customers to erase, from a file (or - for stdin): ids separated by commas or line breaks; "
                   "blank lines and lines starting with # are skipped.")
@click.option("--requests-file", type=click.File("r"), default=None,
              help="Several requests erased in one run, each with its own certificate: a JSON list of "
                   '{"customer_ids": [...], "reference": ..., "requested_by": ...} (what the Airflow DAG passes). '
                   "Not with the options above.")
@click.option("--pending", is_flag=True,
              help="Erase every request waiting in the inbox ($LAKEHOUSE_GDPR_INBOX, filed by `gdpr request` or "
                   "the Airflow DAG) in one run, and take them out of it once verified. Not with the options above.")
@click.option("--reference", default=None, help="The request's reference (ticket); names the certificate.")
@click.option("--requested-by", default="operator", show_default=True, help="Who asked for the erasure.")
@pass_lake
def erase(lake: Lake, **given: Any) -> None:
    """Erase customers and their orders from every table, retained version, file and source topic, then prove it.

    Every request is checked before anything runs: an empty, malformed or oversized id list
    exits 2 and changes nothing. All the requests of one run share one sweep, purge and
    verification. Exit 0 only when the verification passed; each request's certificate
    (pseudonymised ids, tables and instants touched, rows removed, checks, timings) goes to
    $LAKEHOUSE_ROOT/_gdpr/certificates/ and a line to _gdpr/audit.jsonl. Prints one JSON
    line: the request's summary, or a list of them when the run erased several. Beside a
    running ingest stream, run both with LAKEHOUSE_TABLE_SERVICES=external.
    """
    options = EraseOptions(**given)
    if (options.requests_file is not None or options.pending) and \
            (options.names_ids() or (options.requests_file is not None and options.pending)):
        raise InvalidRequest("--requests-file and --pending name their own ids and references: give neither "
                             "--customer-id, --customer-ids, --customer-ids-file, --reference nor the other one "
                             "with them")
    filed = _pending() if options.pending else []
    if options.pending and not filed:
        echo_json({"status": "no pending request", "inbox": inbox.inbox()})
        _push_inbox(lake)
        return
    requests = [f.request for f in filed] if options.pending else _given_requests(options)
    _erase(lake, requests, filed)


@dataclass(frozen=True)
class EraseOptions:
    """`gdpr erase`'s options: the ways of naming the requests (one per run: ids with a reference, a requests
    file, or the inbox's pending ones)."""

    customer_id: tuple[str, ...]
    customer_ids: str | None
    customer_ids_file: TextIO | None
    requests_file: TextIO | None
    pending: bool
    reference: str | None
    requested_by: str

    def names_ids(self) -> bool:
        """Whether the options name ids or a reference themselves, which a requests file or the inbox does."""
        return bool(self.customer_id) or self.customer_ids is not None or self.customer_ids_file is not None \
            or self.reference is not None


def _pending() -> list[inbox.Filed]:
    """The inbox's waiting requests one run erases: up to MAX_IDS ids; the rest wait for the next run."""
    filed: list[inbox.Filed] = []
    for waiting in inbox.pending():
        if filed and sum(len(f.request.customer_ids) for f in filed) + len(waiting.request.customer_ids) > MAX_IDS:
            break
        filed.append(waiting)
    return filed


def _given_requests(options: EraseOptions) -> list[ErasureRequest]:
    """The requests the command line names: a requests file's, or one of the ids given and the reference;
    InvalidRequest (exit 2, nothing erased) listing what is wrong."""
    if options.requests_file is not None:
        return parse_requests(_json_of(options.requests_file))
    ids: list[str] = list(options.customer_id)
    if options.customer_ids is not None:
        ids += [part.strip() for part in options.customer_ids.split(",")]
    if options.customer_ids_file is not None:
        ids += _ids_in(options.customer_ids_file)
    return [parse_request(ids, options.reference, options.requested_by)]


def _erase(lake: Lake, requests: list[ErasureRequest], filed: list[inbox.Filed]) -> None:
    """Erase the requests from `lake` in one run and print their summaries; the inbox's `filed` leave it once
    verified."""
    from pipelines.gdpr.erase import erase_all
    from pipelines.monitoring import job_metrics, metric_names
    from pipelines.monitoring.pushgateway import JobMetrics

    references = ", ".join(r.reference for r in requests)
    run = JobMetrics(metric_names.ERASE, lake.root)
    try:
        certificates = erase_all(lake, requests,
                                 progress=lambda line: click.echo(line, err=True))
    except Exception as exc:  # Spark/Hudi failures: name them and exit 1
        run.push(succeeded=False)
        _push_inbox(lake)
        raise click.ClickException(f"erasure {references} failed: {console.first_line(exc)}") from exc
    job_metrics.erasure(run, certificates)
    run.push(succeeded=all(c.verified for c in certificates))
    summaries = [c.summary() for c in certificates]
    echo_json(summaries[0] if len(summaries) == 1 else summaries)
    if not certificates[0].verified:
        failures = certificates[0].verification.failures
        _push_inbox(lake)
        raise click.ClickException(f"erasure {references} NOT verified: {len(failures)} finding(s), e.g. "
                                   + "; ".join(failures[:5]))
    inbox.remove(filed)
    _push_inbox(lake)


@gdpr.command()
@click.option("--customer-id", "customer_id", multiple=True, help="A customer to erase; repeat for several.")
@click.option("--customer-ids", default=None, metavar="ID,ID,...", help="Customers to erase, comma-separated.")
@click.option("--reference", default=None, help="The request's reference (ticket); names its certificate.")
@click.option("--requested-by", default="operator", show_default=True, help="Who asked for the erasure.")
@pass_lake
def request(lake: Lake, customer_id: tuple[str, ...], customer_ids: str | None, reference: str | None,
            requested_by: str) -> None:
    """File an erasure request in the inbox ($LAKEHOUSE_GDPR_INBOX), for the next `gdpr erase --pending`.

    Checked as `gdpr erase` checks it (exit 2, nothing filed, when invalid). Filing the same
    reference again replaces the waiting request.
    """
    ids = list(customer_id) + ([p.strip() for p in customer_ids.split(",")] if customer_ids is not None else [])
    filed = inbox.file_request(parse_request(ids, reference, requested_by))
    click.echo(f"filed {reference}: {filed}")
    _push_inbox(lake)


def _push_inbox(lake: Lake) -> None:
    """Push what waits in the erasure inbox (after a request is filed, and after each erasure run), labelled with
    the lake's root: the erasure-overdue alert watches the oldest request's filing time, so it needs no further
    push to fire."""
    from pipelines.monitoring import job_metrics, metric_names, pushgateway
    from pipelines.monitoring.pushgateway import JobMetrics

    if pushgateway.gateway() is None:
        return
    run = JobMetrics(metric_names.INBOX, lake.root)
    job_metrics.inbox(run, *inbox.oldest())
    run.push(succeeded=None)


def _ids_in(stream: TextIO) -> list[str]:
    """The ids of an id file: separated by commas or line breaks; blank and # lines skipped."""
    ids = []
    for line in stream:
        if line.strip() and not line.lstrip().startswith("#"):
            ids += [part.strip() for part in line.split(",")]
    return ids


def _json_of(stream: TextIO) -> object:
    try:
        return json.loads(stream.read())
    except ValueError as exc:
        raise InvalidRequest(f"--requests-file {stream.name}: not JSON ({exc})") from exc
