"""The REST API's JSON parser: DRF's, refusing with a 400 what no database stores (a lone
surrogate) and what nests past any API's need (``slotserve_base.json_text``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from slotserve_base.json_text import TOO_DEEP, BadText, check_text


class CheckedJSONParser(JSONParser):
    def parse(
        self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(TOO_DEEP) from None
        try:
            check_text(data)
        except BadText as exc:
            raise ParseError(str(exc)) from None
        return data
