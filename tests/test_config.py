"""Configs: YAML -> checked dataclasses, tagged data/objective sections, --set overrides, and one-line
errors naming the key (a key of an older version's config: its new name)."""
from dataclasses import dataclass

import pytest
import yaml

from mutor2d import config as C
from mutor2d.config_files import CONFIG_DIR
from mutor2d.registry import REGISTRY
from mutor2d.objectives.config import ObjectiveConfig
from mutor2d.sampling.config import check_sampling

CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")      # image runs; LM and VQ ones (task:) load in
                 if "task" not in (yaml.safe_load(p.read_text()) or {}))   # test_lm.py and test_vq.py


def test_defaults_and_overrides():
    cfg = C.load(None, ["optim.lr=1e-3", "objective.name=mutor-2d", "train.batch_size=8",
                        "optim.betas=[0.9, 0.99]", "model.n_layer=3", "objective.d_max=3"])
    assert cfg.optim.lr == 1e-3 and cfg.objective.name == "mutor-2d" and cfg.train.batch_size == 8
    assert cfg.optim.betas == (0.9, 0.99) and cfg.model.n_layer == 3 and cfg.objective.d_max == 3
    assert cfg.objective.name == "mutor-2d" and not hasattr(cfg.objective, "d_min")
    assert C.load(None).data.name == "digits" and C.load(None).objective.name == "ntp"


def test_yaml_file_and_name_lookup(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("model: {preset: small}\nobjective: {name: mutor-1d, d_max: 3}\n")
    cfg = C.load(str(p), ["objective.d_max=5"])
    assert cfg.model.preset == "small" and cfg.objective.d_max == 5 and cfg.objective.d_min == 1
    with pytest.raises(C.ConfigError, match="config 'nope.yaml' not found"):
        C.load("nope.yaml")


@pytest.mark.parametrize("overrides,msg", [
    (["model.depth=3"], "unknown config key 'model.depth'"),
    (["modle.dim=3"], "unknown config section 'modle'"),
    (["optim.lr=fast"], "optim.lr: expected a number, got 'fast'"),
    (["train.batch_size=2.5"], "train.batch_size: expected an integer"),
    (["objective.name=mtp"], "objective.name: expected one of"),
    (["objective.name=mutor-1d", "objective.d_min=5", "objective.d_max=3"], "objective.d_min/d_max"),
    (["objective.name=mutor-2d", "objective.reg_weight=1.5"], "objective.reg_weight"),
    (["train.grad_accum=3", "train.batch_size=8"], "train.grad_accum: 3 does not divide"),
    (["model.preset=custom"], "model.preset: 'custom' needs"),
    (["optim.lr"], "expected section.key=value"),
    # checked at load, not when sampling after training
    (["sample.top_p=7"], r"sample.top_p: expected a number in \(0, 1\]"),
    (["sample.top_k=-1"], "sample.top_k: expected an integer >= 0"),
    (["sample.per_class=0"], "sample.per_class: expected >= 1"),
    (["sample.seed=-1"], r"sample.seed: expected an integer in \[0, 2\^32\)"),
    (["model.n_head=0"], "model.n_head: expected >= 1"),
    (["model.n_head=3"], "model.dim: 64 is not divisible by model.n_head=3"),
    (["model.preset=custom", "model.n_layer=1", "model.n_head=4", "model.dim=24"],
     r"model.rope=2d: needs a head size .*24/4.* divisible by 4"),
    # non-finite numbers, everywhere
    (["optim.lr=.inf"], "optim.lr: expected a finite number, got inf"),
    (["objective.name=mutor-2d", "objective.reg_weight=.nan"], "objective.reg_weight: expected a finite number"),
    (["objective.name=mutor-2d", "objective.reg_weight=nan"], "objective.reg_weight: expected a finite number"),
    (["model.rope_base=-.inf"], "model.rope_base: expected a finite number"),
    (["optim.betas=[0.9, .nan]"], "optim.betas: expected a finite number"),
    (["sample.cfg_scale=.inf"], "sample.cfg_scale: expected a finite number"),
    # variant fields: only the chosen variant's keys exist
    (["objective.name=mutor-2d", "objective.d_min=2"],
     r"unknown config key 'objective.d_min' for objective.name=mutor-2d \(did you mean 'objective.d_max'\? "
     r"known: name, reg_weight, reg_weight_schedule, "
     r"reg_weight_final, reg_weight_steps, reg_target, reg_distill_mix, offset_distribution, register_visibility, "
     r"placement, num_registers, per_register_offsets, edge, d_max\)"),
    (["objective.reg_weight=0.5"], r"unknown config key 'objective.reg_weight' for objective.name=ntp \(known: name\)"),
    (["objective.name=mutor-2d", "objective.d_max_2d=4"], "unknown config key 'objective.d_max_2d'"),
    (["data.degree=3"], "unknown config key 'data.degree' for data.name=digits"),
    (["train.max_step=3"], r"unknown config key 'train.max_step' \(did you mean 'train.max_steps'\? known: batch_size, "),
    (["train.zzz=3"], r"unknown config key 'train.zzz' \(known: batch_size, "),            # nothing close: no guess
    (["objective.name=mutor-2d", "objective.d_max=1"], "objective.d_max: need 2 <= D"),
    (["objective.name=multihead", "objective.num_heads=16"], r"objective.num_heads: expected 0 \(all\) .. 15"),
    (["objective.name=multihead", "objective.layout=1d", "objective.d_max=1"], "objective.d_max"),
    (["data.name=codes"], "data.path: expected the folder written by tokenizers/extract_codes.py"),
    (["data.name=stargraph", "data.num_nodes=5"], "data.num_nodes=5: data.degree=2 arms of data.path_len=5"),
    (["data.levels=1"], "data.levels: expected >= 2"),
    (["train.eval_every=5", "model.conditioning=prompt", "model.rope=1d"], "train.eval_every: the online evaluation"),
    (["model.conditioning=prompt", "sample.cfg_scale=2"], "sample.cfg_scale=2.0: classifier-free guidance"),
])
def test_errors_are_one_line_and_name_the_key(overrides, msg):
    with pytest.raises(C.ConfigError, match=msg) as e:
        C.load(None, overrides)
    assert "\n" not in str(e.value)


def test_yaml_syntax_error_names_the_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  preset: tiny\noptim:\n  lr: [1e-3\ntrain:\n  seed: 1\n")
    with pytest.raises(C.ConfigError, match=r"bad.yaml:\d+: not valid YAML") as e:
        C.load(str(p))
    assert "\n" not in str(e.value)
    p.write_text("model: {preset: tiny}\n  bad indent: 1\n")
    with pytest.raises(C.ConfigError, match=r"bad.yaml:2: not valid YAML"):
        C.load(str(p))
    p.write_text("- a list\n")
    with pytest.raises(C.ConfigError, match="expected a mapping of sections"):
        C.load(str(p))


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_load_and_dump_roundtrip(name):
    cfg = C.load(name)
    again = C.from_dict(yaml.safe_load(C.dump(cfg)))
    assert again == cfg and C.dump(again) == C.dump(cfg)


def test_variant_fields_of_shipped_configs():
    assert C.load("digits_mutor2d").objective == C.make("objective", name="mutor-2d", reg_weight=0.5, d_max=4)
    star = C.load("stargraph_multihead")
    assert star.objective == C.make("objective", name="multihead", layout="1d", d_min=2, d_max=4)
    assert (star.data.degree, star.data.path_len, star.data.num_nodes) == (2, 5, 50)


OLD_CONFIGS = [   # configs (or checkpoints' stored configs) written by older versions -> what the error names
    ({"kind": "image"}, "unknown config section 'kind' (written by an older version: now 'task'; "),
    ({"model": {"prefix": "class"}}, "unknown config key 'model.prefix' (written by an older version: now "
                                     "'model.conditioning'; "),
    ({"objective": {"name": "mutor-2d", "d_max_2d": 3}}, "unknown config key 'objective.d_max_2d' for "
     "objective.name=mutor-2d (written by an older version: now 'objective.d_max'; "),
    ({"objective": {"name": "multihead", "multihead_layout": "1d"}}, "now 'objective.layout'"),
    ({"task": "lm", "train": {"save_every": 5}}, "unknown config key 'train.save_every' (written by an older "
                                                 "version: now 'train.ckpt_every'; "),
    ({"task": "lm", "train": {"padding_side": "left"}}, "now 'data.padding_side'"),
    ({"task": "vq", "train": {"lr": 1e-3}}, "unknown config key 'train.lr' (written by an older version: now "
                                            "'optim.lr'; "),
]


@pytest.mark.parametrize("data,named", OLD_CONFIGS)
def test_a_config_of_an_older_version_is_refused_in_one_line_naming_what_changed(data, named):
    with pytest.raises(C.ConfigError) as e:
        C.from_dict(data)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_section_factories():
    assert C.make("objective", name="ntp") == C.make("objective", name="ntp") and C.make("objective").name == "ntp"
    assert C.make("data").name == "digits" and C.make("data", name="stargraph", num_nodes=20).num_nodes == 20
    with pytest.raises(C.ConfigError, match="unknown config key 'objective.d_max_2d' for objective.name=mutor-2d"):
        C.make("objective", name="mutor-2d", d_max_2d=3)
    with pytest.raises(C.ConfigError, match="objective.reg_weight"):
        C.make("objective", name="mutor-1d", reg_weight=2.0)


def test_check_sampling_names_flags():
    check_sampling(2.0, 0.0, 5, 0.9)
    with pytest.raises(C.ConfigError, match=r"^--top-p: expected"):
        check_sampling(1.0, 1.0, 0, 7.0, names={"top_p": "--top-p"})
    with pytest.raises(ValueError, match=r"^temperature: expected a finite number >= 0"):
        check_sampling(1.0, float("nan"), 0, 1.0, where="")
    with pytest.raises(C.ConfigError, match=r"^gen.top_k: expected an integer"):
        check_sampling(1.0, 1.0, True, 1.0, where="gen")


@pytest.mark.parametrize("overrides,grid,prefix,msg", [
    (["model.rope=1d"], (8, 8), 1, "model.rope=1d: the data is a 8x8 grid"),
    (["objective.name=mutor-2d"], (1, 16), 1, "objective: 2D offsets need a 2D grid, got 1x16"),
    (["objective.name=mutor-2d", "objective.d_max=9"], (8, 8), 1, "objective.d_max=9 exceeds the grid 8x8"),
    (["objective.name=mutor-2d", "objective.placement=sparse", "objective.num_registers=70"], (8, 8), 1,
     "objective.num_registers=70 exceeds the 63 anchors"),
    (["objective.name=mutor-1d", "objective.d_min=9", "objective.d_max=9"], (8, 8), 1, "objective.d_min=9"),
    (["objective.name=multihead"], (1, 16), 1, "objective: 2D offsets need a 2D grid"),
    (["objective.name=multihead", "objective.d_max=5"], (4, 4), 1, "objective.d_max=5 exceeds the grid 4x4"),
    (["sample.classes=[3, 10]"], (8, 8), 1, r"sample.classes: 10 is not a class of the data \(0..9\)"),
])
def test_check_data(overrides, grid, prefix, msg):
    cfg = C.load(None, overrides)
    with pytest.raises(C.ConfigError, match=msg) as e:
        cfg.check_data(grid, prefix, num_classes=10)
    assert "\n" not in str(e.value)


def test_check_against_grid_accepts_the_shipped_settings():
    C.load("digits_mutor2d").check_data((8, 8), 1, num_classes=10)
    C.load("stargraph_mutor").check_data((1, 8), 28)
    C.load("stargraph_multihead").check_data((1, 8), 28)
    C.load("llamagen_b_mutor2d_sparse").check_data((16, 16), 1, num_classes=1000)


def test_register_variant_adds_a_tagged_option():
    @C.register_variant("objective", "test-only")
    @dataclass
    class TestOnly(ObjectiveConfig):
        strength: float = 1.0

        def check(self):
            if self.strength > 2:
                raise C.ConfigError(f"objective.strength: expected <= 2, got {self.strength}")
    try:
        cfg = C.load(None, ["objective.name=test-only", "objective.strength=1.5"])
        assert cfg.objective == TestOnly(1.5) and C.from_dict(cfg.to_dict()) == cfg
        with pytest.raises(C.ConfigError, match="objective.strength: expected <= 2"):
            C.load(None, ["objective.name=test-only", "objective.strength=3"])
    finally:
        del REGISTRY["objective.test-only"]


def test_switching_a_tagged_variant_keeps_only_its_fields():
    """--set objective.name=X on a file written for another variant drops the fields X does not
    have; fields set after the switch are checked against X."""
    assert C.load("digits_mutor2d", ["objective.name=ntp"]).objective == C.make("objective", name="ntp")
    one_d = C.load("digits_mutor2d", ["objective.name=mutor-1d", "objective.d_min=2"]).objective
    assert (one_d.name, one_d.d_min, one_d.reg_weight) == ("mutor-1d", 2, 0.5)
    with pytest.raises(C.ConfigError, match="unknown config key 'objective.d_max' for objective.name=ntp"):
        C.load("digits_mutor2d", ["objective.name=ntp", "objective.d_max=3"])


def test_yaml_booleans_are_read_back_as_the_words_a_choice_expects():
    """YAML 1.1 reads no/off/yes/on as booleans: a string choice takes the word back."""
    assert C.load(None, ["train.mixed_precision=no"]).train.mixed_precision == "no"
    with pytest.raises(C.ConfigError, match=r"train.tracker: expected one of .*, got False"):
        C.load(None, ["train.tracker=no"])
