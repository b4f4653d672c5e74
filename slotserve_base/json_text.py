"""JSON that SlotServe takes from callers, the gateway and the REST API alike: nested no deeper
than any API needs, and text that is Unicode.

Python's json reads a lone surrogate (``"\\ud800"``) as a string that no UTF-8 encoder writes:
stored, such a string fails the database's insert; in the request log it once failed every
flush after it. Nesting past Python's recursion limit fails whatever walks the value next.
Both are refused with a 400 that says where (docs/security.md).
"""

from __future__ import annotations

from typing import Any

# Deeper than any API's body (a tool's JSON Schema nests a few dozen levels at most); a deeper
# one is refused before anything recurses through it.
MAX_DEPTH = 128
TOO_DEEP = f"the JSON body is nested too deeply (at most {MAX_DEPTH} levels)"


class BadText(ValueError):
    """A body that parses but that no process or database could take, in words for the caller."""


def check_text(value: Any, *, strings: bool = True) -> None:
    """``BadText`` naming where ``value`` nests past ``MAX_DEPTH``, or (``strings``) holds a
    string that is not Unicode. Walks without recursing."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadText(TOO_DEEP)
        if isinstance(item, dict):
            for name, inner in item.items():
                if strings and isinstance(name, str) and not is_unicode(name):
                    raise BadText(f"{where or 'the body'}: a name that is not valid UTF-8 (a lone surrogate)")
                stack.append((inner, f"{where}.{name}" if where else str(name), depth + 1))
        elif isinstance(item, list):
            stack.extend((inner, f"{where}[{n}]", depth + 1) for n, inner in enumerate(item))
        elif strings and isinstance(item, str) and not is_unicode(item):
            raise BadText(
                f"{where or 'the body'}: text that is not valid UTF-8 (a lone surrogate such as \\ud800)"
            )


def is_unicode(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
