"""Many roll-up rows written at once, as one plain statement run for each row (``executemany``,
which PostgreSQL's driver sends as a pipeline).

Django's ``bulk_update`` builds a ``CASE`` over every row for every field, and its
``bulk_create`` prepares each value through its field's methods: together they were 28 of a
catch-up's 38 s for 156,000 log rows (docs/benchmarks.md, "The backlog on its real path"). Here a
value is given to the driver as it is, but for dates and times, which go through the database's
own adaptation (SQLite keeps them as text of a fixed form).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model


def insert(model: type[Model], fields: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """New rows of ``model``: each gives a value for every one of ``fields``, which must be all
    its columns but the id (no column is left to a default the database does not know)."""
    columns = [f.attname for f in model._meta.concrete_fields if not f.primary_key]
    assert sorted(fields) == sorted(columns), f"{model.__name__}: {sorted(fields)} is not {sorted(columns)}"
    if not rows:
        return
    names = ", ".join(connection.ops.quote_name(_field(model, f).column) for f in fields)
    places = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({names}) VALUES ({places})"
    _run(sql, _adapted(model, fields, rows))


def update(model: type[Model], fields: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Rows of ``model`` changed: each gives the new values of ``fields``, then its id."""
    if not rows:
        return
    quote = connection.ops.quote_name
    sets = ", ".join(f"{quote(_field(model, f).column)} = %s" for f in fields)
    pk = quote(model._meta.pk.column)
    sql = f"UPDATE {quote(model._meta.db_table)} SET {sets} WHERE {pk} = %s"
    _run(sql, _adapted(model, [*fields, model._meta.pk.attname], rows))


def _adapted(
    model: type[Model], fields: Sequence[str], rows: Sequence[Sequence[Any]]
) -> list[tuple[Any, ...]]:
    adapters = [_adapter(_field(model, f).get_internal_type()) for f in fields]
    if all(a is None for a in adapters):
        return [tuple(row) for row in rows]
    return [
        tuple(
            value if adapt is None or value is None else adapt(value)
            for adapt, value in zip(adapters, row, strict=True)
        )
        for row in rows
    ]


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column, f"{model.__name__}.{name} is no column"
    return field


def _adapter(kind: str) -> Callable[[Any], Any] | None:
    if kind == "DateTimeField":
        return connection.ops.adapt_datetimefield_value
    if kind == "DateField":
        return connection.ops.adapt_datefield_value
    return None


def _run(sql: str, params: list[tuple[Any, ...]]) -> None:
    with connection.cursor() as cursor:
        for at in range(0, len(params), 5000):
            cursor.executemany(sql, params[at : at + 5000])
