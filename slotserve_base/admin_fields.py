"""Admin form fields for what staff edit by hand: GPU indexes and labels (JSON columns), and
memory with its unit.

A raw JSON box invites ``[0,1`` and ``{"gpu": a100}``; these read ``0, 1`` and one
``key=value`` per line, and say what is wrong in the same words.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from slotserve_base.api_fields import is_id

LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$")


class GpuIndexesField(forms.Field):
    """A channel's GPUs as ``0, 1``: NVML indexes on its node, separated by commas or spaces."""

    widget = forms.TextInput(attrs={"placeholder": "0, 1"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "The node's GPU indexes this channel uses, e.g. 0 or 0, 1.")
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("["):
            try:
                value = json.loads(value)
            except ValueError:
                return value
        if isinstance(value, list):
            return ", ".join(str(v) for v in value)
        return value

    def to_python(self, value: Any) -> list[int]:
        text = str(value or "").strip().strip("[]")
        indexes = []
        for part in re.split(r"[,\s]+", text):
            if not part:
                continue
            if not is_id(part):
                raise ValidationError(f"{part!r} is not a GPU index: write numbers like 0, 1")
            indexes.append(int(part))
        if not indexes and self.required:
            raise ValidationError("name at least one GPU index, e.g. 0")
        if len(set(indexes)) != len(indexes):
            raise ValidationError("each GPU index once")
        return indexes


class LabelsField(forms.Field):
    """Labels as one ``key=value`` per line (placement's selectors match them)."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 40, "placeholder": "gpu=a100\nzone=lab-1"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("help_text", "One key=value per line, e.g. gpu=a100.")
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("{"):
            try:
                value = json.loads(value)
            except ValueError:
                return value
        if isinstance(value, dict):
            return "\n".join(f"{k}={v}" for k, v in value.items())
        return value

    def to_python(self, value: Any) -> dict[str, str]:
        labels: dict[str, str] = {}
        for number, line in enumerate(str(value or "").splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            key, sep, val = line.partition("=")
            key, val = key.strip(), val.strip()
            if not sep or not key:
                raise ValidationError(f"line {number}: write key=value, not {line!r}")
            if not LABEL_KEY.match(key):
                raise ValidationError(f"line {number}: {key!r} is not a label key (letters, digits, _ . - /)")
            if key in labels:
                raise ValidationError(f"line {number}: {key} is given twice")
            labels[key] = val
        return labels


GiB = 2**30
UNITS = {
    "kib": 2**10,
    "mib": 2**20,
    "gib": GiB,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "b": 1,
}
MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
# A bare number above this many GiB was meant as bytes: no GPU or model is 16 TiB.
BARE_GIB_AT_MOST = 16 * 1024


def gib(size: int | None) -> str:
    """``80 GiB``, ``74.51 GiB``: memory in binary gigabytes, named so (never "GB" for GiB); under
    a GiB in the binary unit that says it (``512 MiB``, ``1.5 KiB``), never ``0 GiB``."""
    if size is None:
        return ""
    unit, name = next(
        ((u, n) for u, n in ((GiB, "GiB"), (2**20, "MiB"), (2**10, "KiB")) if size >= u), (1, "bytes")
    )
    return f"{size / unit:.2f}".rstrip("0").rstrip(".") + f" {name}"


class MemoryField(forms.Field):
    """Memory as ``80 GiB`` (or ``512 MiB``, ``1.5 TiB``, ``80 GB`` for decimal gigabytes; a bare
    number is GiB): stored in bytes, shown in GiB."""

    widget = forms.TextInput(attrs={"placeholder": "80 GiB", "size": 12})

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "With its unit, e.g. 80 GiB or 512 MiB; a bare number is GiB.")
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        return gib(value) if isinstance(value, int) else value

    def to_python(self, value: Any) -> int:
        text = str(value if value is not None else "").strip()
        if not text:
            if self.required:
                raise ValidationError("give the memory, e.g. 80 GiB")
            return 0  # not known
        found = MEMORY.match(text)
        unit = (found.group(2) or "gib").lower() if found else ""
        if found is None or unit not in UNITS:
            raise ValidationError(f"{text!r} is not an amount of memory: write it like 80 GiB or 512 MiB")
        number = float(found.group(1))
        if not found.group(2) and number > BARE_GIB_AT_MOST:
            raise ValidationError(
                f"{text} GiB is more than any GPU has: was it bytes? Write the unit, e.g. {gib(int(number))}"
            )
        return int(number * UNITS[unit])
