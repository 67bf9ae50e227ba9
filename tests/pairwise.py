"""Pairwise cases: every value of each factor meets every value of each other factor in some
case, so a check whose outcome turns on one factor or on two together runs every way, in a
fraction of the full product (3 x 2 x 3 x 2 = 36 builds, against 9).

The cases are chosen by hand (which combinations share compiled programs matters more than the
fewest cases), and ``pairwise`` refuses a list that misses a pair, naming it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any


def pairwise(factors: dict[str, Sequence[Any]], cases: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``cases`` (one value per factor, in the order of ``factors``), checked to hold every pair.

    Raises:
        ValueError: a case has a value its factor does not list, or two factors' values never meet.
    """
    names = list(factors)
    for case in cases:
        if len(case) != len(names) or any(v not in factors[n] for n, v in zip(names, case)):
            raise ValueError(f"case {case} does not take one value of each of {factors}")
    for (i, a), (j, b) in itertools.combinations(enumerate(names), 2):
        seen = {(case[i], case[j]) for case in cases}
        missing = [p for p in itertools.product(factors[a], factors[b]) if p not in seen]
        if missing:
            raise ValueError(f"no case has {a}={missing[0][0]!r} with {b}={missing[0][1]!r}: add one")
    return list(cases)
