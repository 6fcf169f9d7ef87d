"""The parameter table (softknn.common.table) and the one step that fills what a request or a command leaves
unset: the given value, else the settings', else the table's default; the bundle fills what is still unset."""

from __future__ import annotations

import pytest

from softknn.common.errors import InvalidInput
from softknn.common.table import (
    DEFAULT_TEMPERATURE,
    FIXED_K,
    FIXED_PRIOR,
    GenParams,
    InferParams,
    entries,
    fill,
)
from softknn.params import GenDefaults, InferDefaults, Settings, gen_params, infer_params


def test_the_settings_sections_are_the_tables_settings_with_its_defaults():
    for cls, section in ((InferParams, InferDefaults), (GenParams, GenDefaults)):
        settings = {e.name: e for e in entries(cls) if e.param.setting}
        assert set(section.model_fields) == set(settings), cls
        for name, e in settings.items():
            f = section.model_fields[name]
            assert (f.default, f.description) == (e.default, e.param.description), name
    assert InferParams.from_defaults(Settings().defaults) == InferParams()
    assert gen_params(Settings(), {}) == GenParams()


def test_given_values_override_the_defaults_and_none_leaves_them():
    d = InferDefaults(alpha=0.5, k=3, kernel="uniform", evidence=2)
    p = InferParams.from_defaults(d, k=None, alpha=0.9, exact=True, temperature=None, retrieval="dense")
    assert (p.alpha, p.k, p.kernel, p.evidence, p.exact, p.temperature, p.retrieval) == (
        0.9, 3, "uniform", 2, True, None, "dense")
    src = dict(p.sources)
    assert (src["alpha"], src["k"], src["mixing"], src["retrieval"]) == ("request", "settings", "default", "request")


def test_an_invalid_given_value_is_refused_with_its_field():
    with pytest.raises(InvalidInput) as e:
        InferParams.from_defaults(InferDefaults(), alpha=1.5)
    assert e.value.field == "alpha"
    assert str(e.value) == "alpha must be in [0, 1], got 1.5"
    with pytest.raises(InvalidInput, match=r"mixing must be one of \('fixed', 'joint'\), got 'both'"):
        fill(GenParams, {"mixing": "both"})
    with pytest.raises(InvalidInput, match=r"top_p must be in \(0, 1\], got 0"):
        fill(GenParams, {"top_p": 0})


def test_tau_has_one_pair_of_bounds_in_the_core_the_settings_and_the_requests():
    with pytest.raises(InvalidInput) as e:
        InferParams(temperature=1e-7).validate()
    assert e.value.field == "knn_temperature"
    with pytest.raises(InvalidInput):
        GenParams(knn_temperature=2e6).validate()
    with pytest.raises(ValueError):
        Settings(defaults={"knn_temperature": 1e-7})


def test_a_deprecated_name_counts_as_its_parameter_and_may_not_disagree_with_it():
    assert fill(InferParams, {"temperature": 0.07}).temperature == 0.07
    assert fill(InferParams, {"temperature": 0.07, "knn_temperature": 0.07}).temperature == 0.07
    with pytest.raises(InvalidInput) as e:
        fill(InferParams, {"temperature": 0.07, "knn_temperature": 0.5})
    assert e.value.field == "temperature"


def test_the_bundle_fills_what_the_request_and_the_settings_leave_unset():
    p = infer_params(Settings(), {}).resolved(True, {"hybrid": {"lexical_weight": 0.1}})
    assert (p.retrieval, p.lexical_weight, p.temperature) == ("hybrid", 0.1, DEFAULT_TEMPERATURE["hybrid"])
    src = dict(p.sources)
    assert (src["retrieval"], src["lexical_weight"], src["knn_temperature"]) == ("bundle", "bundle", "default")
    g = gen_params(Settings(generate={"k": 2}), {"prior": 1.0})
    assert (g.k, g.prior, dict(g.sources)["k"], dict(g.sources)["prior"]) == (2, 1.0, "settings", "request")
    assert (GenParams().k, GenParams().prior, FIXED_K, FIXED_PRIOR) == (None, None, 4, 4.0)  # the bundle's, else these


def test_an_unset_max_tokens_is_at_most_the_servers_limit():
    s = Settings(generator={"max_tokens": 32})
    assert gen_params(s, {}).max_tokens == 32 and gen_params(Settings(), {}).max_tokens == 64
    assert gen_params(s, {"max_tokens": 40}).max_tokens == 40  # what a request sends is checked by its schema
