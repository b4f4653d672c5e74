"""Pages of the REST API's lists: a list ends, whatever the data's size.

Without ``?limit=`` a list answers as it always has, a JSON array, but of at most 100 items;
``X-Total-Count`` says how many there are and ``Link`` (``rel="next"``, ``rel="prev"``, as
GitHub's API gives them) where the rest are. With ``?limit=`` (at most 1,000) and ``?offset=``
the answer is DRF's envelope, ``{count, next, previous, results}`` (docs/api.md).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param
from rest_framework.views import APIView

PAGE = 100


class ListPages(LimitOffsetPagination):
    default_limit = PAGE
    max_limit = 1000

    def paginate_queryset(
        self, queryset: QuerySet[Any], request: Request, view: APIView | None = None
    ) -> list[Any] | None:
        self.plain = self.limit_query_param not in request.query_params
        return super().paginate_queryset(queryset, request, view)

    def get_paginated_response(self, data: Any) -> Response:
        if not self.plain:
            return super().get_paginated_response(data)
        answer = Response(data)
        answer["X-Total-Count"] = str(self.count or 0)
        assert self.request is not None and self.limit is not None and self.offset is not None
        offset, limit, count = self.offset, self.limit, self.count or 0
        url = remove_query_param(self.request.build_absolute_uri(), self.limit_query_param)
        links = []
        if offset + limit < count:
            links.append(f'<{replace_query_param(url, self.offset_query_param, offset + limit)}>; rel="next"')
        if offset > 0:
            before = max(0, offset - limit)
            previous = (
                replace_query_param(url, self.offset_query_param, before)
                if before
                else remove_query_param(url, self.offset_query_param)
            )
            links.append(f'<{previous}>; rel="prev"')
        if links:
            answer["Link"] = ", ".join(links)
        return answer
