"""Configs: YAML -> dataclasses, --set overrides, one-line errors naming the key."""
import pytest

from mutor2d import config as C


def test_defaults_and_overrides():
    cfg = C.load(None, ["optim.lr=1e-3", "objective.name=mutor-2d", "train.batch_size=8",
                        "optim.betas=[0.9, 0.99]", "model.n_layer=3"])
    assert cfg.optim.lr == 1e-3 and cfg.objective.name == "mutor-2d" and cfg.train.batch_size == 8
    assert cfg.optim.betas == (0.9, 0.99) and cfg.model.n_layer == 3


def test_yaml_file_and_name_lookup(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("model: {preset: small}\nobjective: {name: mutor-1d, d_max: 3}\n")
    cfg = C.load(str(p), ["objective.d_max=5"])
    assert cfg.model.preset == "small" and cfg.objective.d_max == 5
    with pytest.raises(C.ConfigError, match="config 'nope.yaml' not found"):
        C.load("nope.yaml")


@pytest.mark.parametrize("overrides,msg", [
    (["model.depth=3"], "unknown config key 'model.depth'"),
    (["modle.dim=3"], "unknown config section 'modle'"),
    (["optim.lr=fast"], "optim.lr: expected a number, got 'fast'"),
    (["train.batch_size=2.5"], "train.batch_size: expected an integer"),
    (["objective.name=mtp"], "objective.name: expected one of"),
    (["objective.d_min=5", "objective.d_max=3"], "objective.d_min/d_max"),
    (["objective.reg_weight=1.5"], "objective.reg_weight"),
    (["train.grad_accum=3", "train.batch_size=8"], "train.grad_accum: 3 does not divide"),
    (["model.preset=custom"], "model.preset: 'custom' needs"),
    (["optim.lr"], "expected section.key=value"),
])
def test_errors_are_one_line_and_name_the_key(overrides, msg):
    with pytest.raises(C.ConfigError, match=msg) as e:
        C.load(None, overrides)
    assert "\n" not in str(e.value)


def test_dump_roundtrip():
    import yaml
    cfg = C.load(None, ["objective.name=mutor-2d"])
    again = C.from_dict(yaml.safe_load(C.dump(cfg)))
    assert again == cfg
