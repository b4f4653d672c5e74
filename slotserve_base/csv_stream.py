"""CSV answers that stream: rows go out as the database hands them over, a batch at a time.

Under ASGI the answer is an async iterator, each batch read in the request's own thread
(``sync_to_async``, thread-sensitive: one database cursor for the whole export), so the first
bytes leave at once, the server's event loop serves other requests between batches, and a
client that leaves stops the export (Django cancels the iteration). Under WSGI and the test
client, the same batches from a plain iterator. Every cell goes through ``csv_cells.safe_cell``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

from slotserve_base.csv_cells import SafeWriter

BATCH = 2000  # rows read and written at a time


def csv_response(
    request: HttpRequest, header: Sequence[str], rows: Iterable[Sequence[Any]], filename: str
) -> StreamingHttpResponse:
    """``rows`` (read lazily: a ``values_list(...).iterator()``) as a CSV download."""
    source = iter(rows)
    if isinstance(request, ASGIRequest):
        answer = StreamingHttpResponse(_async_lines(header, source), content_type="text/csv; charset=utf-8")
    else:
        answer = StreamingHttpResponse(_lines(header, source), content_type="text/csv; charset=utf-8")
    answer["Content-Disposition"] = f'attachment; filename="{filename}"'
    return answer


def _text(rows: Iterable[Sequence[Any]]) -> str:
    out = io.StringIO()
    writer = SafeWriter(out)
    for row in rows:
        writer.writerow(row)
    return out.getvalue()


def _header(header: Sequence[str]) -> str:
    out = io.StringIO()
    csv.writer(out).writerow(header)
    return out.getvalue()


def _lines(header: Sequence[str], source: Iterator[Sequence[Any]]) -> Iterator[str]:
    yield _header(header)
    while batch := list(islice(source, BATCH)):
        yield _text(batch)


def _take(source: Iterator[Sequence[Any]]) -> str:
    return _text(islice(source, BATCH))


async def _async_lines(header: Sequence[str], source: Iterator[Sequence[Any]]) -> AsyncIterator[str]:
    yield _header(header)
    take = sync_to_async(_take, thread_sensitive=True)
    while text := await take(source):
        yield text
