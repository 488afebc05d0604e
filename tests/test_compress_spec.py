"""Compression specs: parsing, canonical form, errors; BackendConfig and State options."""

from __future__ import annotations

import pytest

from homagg import ConfigError, HomAggError
from homagg.compress import Compressor, format_spec, from_spec, parse
from homagg.torch._config import BackendConfig


@pytest.mark.parametrize("spec, name, params", [
    ("topk:0.01", "topk", {"fraction": 0.01, "ef": True}),
    ("threshold:density=0.01", "threshold", {"density": 0.01, "value": None}),
    ("threshold:1e-3", "threshold", {"value": 1e-3, "density": None}),
    ("dgc:0.001", "dgc", {"density": 0.001, "momentum": 0.9, "clip": 0.0}),
    ("DGC: 0.001 , momentum=0.5, clip=2, warmup=100", "dgc", {"momentum": 0.5, "clip": 2.0, "warmup": 100}),
    ("onebit", "onebit", {"ef": True, "block": 1024}),
    ("twobit:block=256", "twobit", {"block": 256}),
    ("terngrad", "terngrad", {"ef": False}),
    ("qsgd:levels=16", "qsgd", {"levels": 16, "norm": "l2"}),
    ("qsgd:4,norm=max,ef=1", "qsgd", {"levels": 4, "norm": "max", "ef": True}),
    ("randk:0.1,shared=0", "randk", {"fraction": 0.1, "shared": False}),
])
def test_valid_specs_parse_and_round_trip(spec: str, name: str, params: dict) -> None:
    stages = parse(spec)
    assert stages is not None and stages[-1].name == name
    for k, v in params.items():
        assert stages[-1].params[k] == v, k
    assert parse(format_spec(stages)) == stages
    assert Compressor(spec).spec == format_spec(stages)


@pytest.mark.parametrize("spec", [None, "", "none", "exact", " NONE "])
def test_no_compression_is_the_default(spec) -> None:
    assert parse(spec) is None and from_spec(spec) is None
    assert BackendConfig.resolve({}, env={}).compress is None


@pytest.mark.parametrize("spec, words", [
    ("bogus", "unknown stage"),
    ("topk", "needs fraction"),
    ("topk:0", "fraction in (0, 1]"),
    ("topk:1.5", "fraction in (0, 1]"),
    ("topk:abc", "not a float"),
    ("topk:0.1,foo=1", "no parameter 'foo'"),
    ("topk:fraction=0.1,fraction=0.2", "given twice"),
    ("threshold", "exactly one of"),
    ("threshold:value=1,density=0.1", "exactly one of"),
    ("threshold:value=-1", "finite number >= 0"),
    ("qsgd:levels=0", "levels"),
    ("qsgd:levels=2.5", "not an int"),
    ("qsgd:norm=l1", "'l2' or 'max'"),
    ("onebit:0.5", "key=value"),
    ("dgc:0.01,momentum=1", "[0, 1)"),
    ("onebit|topk:0.1", "must be the last stage"),
    ("topk:0.1|dgc:0.01", "must be the first stage"),
    ("topk:0.1||onebit", "empty stage"),
    ("onebit:ef=maybe", "not a bool"),
])
def test_bad_specs_raise_config_error(spec: str, words: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        parse(spec)
    assert isinstance(err.value, HomAggError)
    assert words in str(err.value), str(err.value)


def test_non_string_spec_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse(0.01)  # type: ignore[arg-type]


def test_backend_config_option_and_environment() -> None:
    assert BackendConfig.resolve({"compress": "topk:0.01"}, env={}).compress == "topk:ef=1,fraction=0.01"
    assert BackendConfig.resolve(None, env={"HOMAGG_COMPRESS": "onebit"}).compress == format_spec(parse("onebit"))
    # pg_options wins over the environment, including "none"
    assert BackendConfig.resolve({"compress": "none"}, env={"HOMAGG_COMPRESS": "onebit"}).compress is None
    with pytest.raises(ConfigError, match="HOMAGG_COMPRESS"):
        BackendConfig.resolve(None, env={"HOMAGG_COMPRESS": "topk:7"})
    with pytest.raises(ConfigError, match=r"pg_options\['compress'\]"):
        BackendConfig.resolve({"compress": "qsgd:levels=-1"}, env={})
    with pytest.raises(ConfigError, match="canonical"):
        BackendConfig(compress="topk:0.01")


def test_compressor_needs_something_to_do() -> None:
    with pytest.raises(ConfigError):
        Compressor("none")
    with pytest.raises(ConfigError):
        Compressor()
