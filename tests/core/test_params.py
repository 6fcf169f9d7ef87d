"""InferParams from the settings' defaults: the one way the commands build their parameters."""

from __future__ import annotations

import dataclasses

import pytest

from softknn.common.errors import InvalidInput
from softknn.infer.engine import InferParams
from softknn.params import InferDefaults, Settings
from softknn.retrieval.search import SETTING_ATTRS


def test_the_settings_defaults_are_the_params_defaults():
    names = {SETTING_ATTRS.get(n, n) for n in InferDefaults.model_fields}
    assert names <= {f.name for f in dataclasses.fields(InferParams)}  # every setting is a parameter
    assert InferParams.from_defaults(Settings().defaults) == InferParams()


def test_given_values_override_the_defaults_and_none_leaves_them():
    d = InferDefaults(alpha=0.5, k=3, kernel="uniform", evidence=2)
    p = InferParams.from_defaults(d, k=None, alpha=0.9, exact=True, temperature=None, retrieval="dense")
    assert (p.alpha, p.k, p.kernel, p.evidence, p.exact, p.temperature, p.retrieval) == (
        0.9, 3, "uniform", 2, True, None, "dense")


def test_an_invalid_given_value_is_refused_with_its_field():
    with pytest.raises(InvalidInput) as e:
        InferParams.from_defaults(InferDefaults(), alpha=1.5)
    assert e.value.field == "alpha"
    assert str(e.value) == "alpha must be in [0, 1], got 1.5"
