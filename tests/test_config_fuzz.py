"""Config fuzzing: any value in any field of any section (and of every variant of the tagged
sections) either loads or raises a one-line ConfigError naming that field — never another
exception. Bounded (a few hundred examples, no training) so the suite stays fast."""
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mutor2d import config as C
from mutor2d.image.config import ImageRunConfig
from mutor2d.registry import REGISTRY, named
from mutor2d.sampling.config import check_sampling

C.import_parts()
PLAIN = {name: e.cls for name, e in REGISTRY.items() if "." not in name and e.cls is not None}   # the plain sections

# A valid starting point per variant; the fuzzed field replaces its value.
BASE = {("data", "codes"): {"path": "codes/"}}


def targets() -> list[tuple[str, str | None, str]]:
    """(section, variant name or None, field) for every field of every section and variant."""
    out = [(s, None, f.name) for s, cls in PLAIN.items() for f in dataclasses.fields(cls)]
    for section, variants in {s: named(s) for s in C.DEFAULT_VARIANT}.items():
        out.append((section, None, "name"))
        for name, cls in variants.items():
            out += [(section, name, f.name) for f in dataclasses.fields(cls)]
    return out


def nest(section: str, body) -> dict:
    """A config dict holding ``body`` as ``section``; a dotted name is a nested section (sample.decode)."""
    top, *inner = section.split(".")
    for key in reversed(inner):
        body = {key: body}
    return {top: body}


WEIRD = st.sampled_from([0, -1, 1, 2, 3, 7, 2 ** 32, 2 ** 63, 10 ** 30, -10 ** 30, 0.5, -0.5, 1.5, 1e300,
                         "nan", "inf", "-inf", "1e-3", "", "x", "dense", "2d", [], [1, 2], {}, None, True])
VALUES = st.one_of(
    WEIRD,
    st.none(), st.booleans(),
    st.integers(min_value=-10 ** 30, max_value=10 ** 30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.one_of(st.integers(-3, 12), st.floats(), st.text(max_size=2)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=st.sampled_from(targets()), value=VALUES)
def test_any_value_loads_or_names_the_field(target, value):
    section, variant, name = target
    body = dict(BASE.get((section, variant), {}))
    if variant is not None:
        body["name"] = variant
    body[name] = value
    try:
        cfg = C.from_dict(nest(section, body))
    except C.ConfigError as e:
        msg = str(e)
        assert "\n" not in msg
        assert f"{section}." in msg and name in msg, (target, value, msg)
        return
    assert isinstance(cfg, ImageRunConfig)
    assert C.from_dict(cfg.to_dict()) == cfg          # whatever loads also round-trips


SAMPLING = ("cfg_scale", "temperature", "top_k", "top_p")


@settings(max_examples=100, deadline=None, database=None)
@given(field=st.sampled_from(SAMPLING), value=VALUES)
def test_sampling_values_pass_or_name_the_field(field, value):
    kwargs = dict(cfg_scale=1.0, temperature=1.0, top_k=0, top_p=1.0)
    kwargs[field] = value
    try:
        check_sampling(**kwargs, where="sample")
    except C.ConfigError as e:
        assert str(e).startswith(f"sample.{field}: expected") and "\n" not in str(e)


@pytest.mark.parametrize("section", list(PLAIN) + list(C.DEFAULT_VARIANT))
def test_non_mapping_sections_are_named(section):
    with pytest.raises(C.ConfigError, match=f"^{section}: expected a mapping"):
        C.from_dict(nest(section, [1, 2]))


HUGE = [2 ** 32, 2 ** 63, 10 ** 30, -10 ** 30]


@pytest.mark.parametrize("value", HUGE)
def test_every_field_names_itself_for_huge_values(value):
    """The fuzz above draws a few fields at random; a huge integer in *any* field (d_max = 2^32 once
    listed 2^64 candidate offsets until the process was killed) loads or is a one-line error naming
    the field, fast."""
    for section, variant, name in targets():
        test_any_value_loads_or_names_the_field.hypothesis.inner_test(target=(section, variant, name), value=value)
