"""The suite's float rule (tests/numerics.py): absolute at unit scale, relative above it."""

from __future__ import annotations

import pytest

from tests.numerics import assert_tree_close, close


def test_an_effective_k_agreeing_to_5e_7_relative_is_close():
    # the two runtimes' effective k on an AVX-512 machine: 1.6e-4 apart, 4.8e-7 relative
    assert close(342.7496749302997, 342.74983836611966, 1e-4)
    assert not close(342.7496749302997, 342.74983836611966 * (1 + 2e-4), 1e-4)


def test_unit_scale_values_are_compared_absolutely():
    assert close(0.3, 0.3 + 9e-5, 1e-4)
    assert not close(0.3, 0.3 + 1.1e-4, 1e-4)
    assert not close(1e-3, 2e-3, 1e-4)  # not relative below 1: 1e-3 apart is far for a weight
    assert close(float("nan"), float("nan"), 1e-4) and not close(float("nan"), 0.0, 1e-4)


def test_trees_compare_numbers_by_the_rule_and_the_rest_exactly():
    a = {"ids": ["faq-1", "faq-2"], "k": 8, "eff_k": 342.74967, "w": [0.5, 0.25], "flag": True}
    assert_tree_close(a, {**a, "eff_k": 342.74984, "w": [0.50004, 0.25]}, 1e-4)
    with pytest.raises(AssertionError):
        assert_tree_close(a, {**a, "ids": ["faq-2", "faq-1"]}, 1e-4)
    with pytest.raises(AssertionError):
        assert_tree_close(a, {**a, "w": [0.5003, 0.25]}, 1e-4)
    with pytest.raises(AssertionError):
        assert_tree_close(a, {**a, "k": 9}, 1e-4)
    assert_tree_close({"request_id": "x", "v": 1.0}, {"request_id": "y", "v": 1.0}, 1e-4,
                      skip=lambda path: path.endswith("request_id"))
