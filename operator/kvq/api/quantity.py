"""Kubernetes quantities ("16Gi", "500m") as kvq accepts them, and their value."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from kvq.api.rules import FieldRule

# A Kubernetes quantity as kvq accepts it: a plain decimal with an optional suffix
# (m for milli-cores; k/M/G/T/P/E decimal, Ki/Mi/Gi/Ti/Pi/Ei binary).
QUANTITY_RE = r"^[0-9]+([.][0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"

_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def quantity_value(quantity: str) -> float:
    """A quantity as a number: "16Gi" -> 17179869184.0, "500m" -> 0.5."""
    match = re.fullmatch(QUANTITY_RE, quantity)
    if match is None:
        raise ValueError(f"not a quantity: {quantity!r}")
    number = quantity[: len(quantity) - len(match.group(2) or "")]
    return float(number) * _SUFFIX[match.group(2) or ""]


Quantity = Annotated[
    str,
    Field(max_length=32),
    FieldRule(
        cel=f"self.matches('{QUANTITY_RE}')",
        message='must be a quantity written as a string, such as "16Gi", "500m" or "4"',
        check=lambda v: re.fullmatch(QUANTITY_RE, v) is not None,
    ),
]

# A Kubernetes quantity that must be more than 0 (a volume's size).
PositiveQuantity = Annotated[
    Quantity,
    FieldRule(
        cel="self.matches('[1-9]')",
        message="size must be greater than 0",
        check=lambda v: re.search("[1-9]", v) is not None,
    ),
]
