"""The pairwise helper the matrix tests choose their cases with refuses a list that misses a pair."""

import itertools

import pytest
from pairwise import pairwise

FACTORS = {"layout": ["colocated", "reshaped", "split"], "lora": [False, True], "reshard": ["xla", "minimal"]}


def test_the_full_product_holds_every_pair():
    cases = list(itertools.product(*FACTORS.values()))
    assert pairwise(FACTORS, cases) == cases


def test_a_missing_pair_is_named():
    cases = [c for c in itertools.product(*FACTORS.values()) if not (c[0] == "split" and c[2] == "minimal")]
    with pytest.raises(ValueError, match="no case has layout='split' with reshard='minimal'"):
        pairwise(FACTORS, cases)


def test_a_value_outside_its_factor_is_refused():
    with pytest.raises(ValueError, match="does not take one value of each"):
        pairwise(FACTORS, [("colocated", False, "fastest")])
