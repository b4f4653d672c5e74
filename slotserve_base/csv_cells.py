"""CSV that spreadsheets open safely: a cell that starts like a formula is written as text.

A key named ``=HYPERLINK(…)`` or a group named ``=cmd|…`` would otherwise run as a formula in
the spreadsheet of whoever opens the export. As OWASP recommends, a cell that begins with
``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a single quote in front, which
spreadsheets show as text and do not evaluate (docs/security.md). Numbers are left as numbers.

Every text cell is quoted, too: a spreadsheet set to split on ``;`` (as in much of Europe) would
otherwise cut ``x;=1+1`` into a cell ``x`` and a formula ``=1+1``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from typing import Any, Protocol

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class _Writable(Protocol):
    def write(self, text: str, /) -> Any: ...


def safe_cell(value: Any) -> Any:
    """``value`` as a spreadsheet may read it: text starting like a formula gets a leading quote."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class SafeWriter:
    """``csv.writer`` whose every text cell goes through ``safe_cell`` and is quoted."""

    def __init__(self, out: _Writable) -> None:
        self._writer = csv.writer(out, quoting=csv.QUOTE_NONNUMERIC)

    def writerow(self, row: Iterable[Any]) -> None:
        self._writer.writerow([safe_cell(value) for value in row])
