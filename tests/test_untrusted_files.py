"""Files from strangers that reach pickle by other roads than checkpoints (those: test_reliability.py
for .pt files, test_fsdp.py and test_fsdp_lm.py for sharded folders): a peft adapter saved as a pickle,
and a checkpoint whose config names a module to import. Each payload would create a marker file; none
may, and each refusal is one line."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_training import tiny  # noqa: E402

from mutor2d import checkpoint as ckpt_lib  # noqa: E402
from mutor2d.checkpoint import inference  # noqa: E402
from mutor2d import io  # noqa: E402
from mutor2d.engine.loop import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class Payload:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickled_peft_adapter_is_refused_in_one_line(tmp_path):
    """An adapter folder whose adapter_model.bin would run code: load_for_inference names the folder in
    one line (peft reads .bin adapters with weights_only=True; its traceback was many screens)."""
    pytest.importorskip("peft", reason="the language path needs the lm extra: pip install -e '.[lm]'")
    from mutor2d.lm import hf
    from mutor2d.lm.tiny import write_tiny_llama
    base = write_tiny_llama(tmp_path / "base", hidden=16, layers=1, heads=2)
    lora = hf.apply_lora(hf.load_causal_lm(base), 2, 4.0, 0.0, ["q_proj", "v_proj"], base_ref=str(base))
    lora.save_pretrained(tmp_path / "adapter", safe_serialization=True)
    (tmp_path / "adapter" / "adapter_model.safetensors").unlink()
    marker = tmp_path / "ran"
    torch.save({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": Payload(marker)},
               tmp_path / "adapter" / "adapter_model.bin")
    with pytest.raises(hf.LMModelError, match="pickled Python objects beyond tensors") as e:
        hf.load_for_inference(tmp_path / "adapter")
    assert "\n" not in str(e.value) and str(tmp_path / "adapter") in str(e.value) and not marker.exists()


def test_a_checkpoint_never_names_a_module_to_import(tmp_path, monkeypatch):
    """Plugins come from MUTOR2D_PLUGINS only: a checkpoint whose config names an importable module never
    imports it. As its objective, the name is kept as stored (sampling needs no objective: an
    UnknownVariant, whose rules are refused naming it); under a ``plugins`` key, the file is refused
    in one line."""
    (tmp_path / "evil_plugin.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("MUTOR2D_PLUGINS", raising=False)
    train(tiny("train.max_steps=1", "train.ckpt_every=1", "train.sample_every=0"), tmp_path / "run")
    path = ckpt_lib.list_checkpoints(tmp_path / "run")[-1]
    saved = {k: v for k, v in io.read_torch_file(path).items() if k != io.CHECKSUM_KEY}
    config = json.loads(json.dumps(saved["config"]))
    config["objective"]["name"] = "evil_plugin"
    torch.save(io.with_checksum({**saved, "config": config}), path)
    objective = inference.open_model(path)[1].objective
    with pytest.raises(ValueError, match="objective.name='evil_plugin' is not a variant this process knows"):
        objective.register_spec()
    torch.save(io.with_checksum({**saved, "config": {**config, "plugins": "evil_plugin"}}), path)
    with pytest.raises(ValueError) as e:
        inference.open_model(path)
    assert "\n" not in str(e.value) and "'plugins'" in str(e.value)
    assert not (tmp_path / "ran").exists() and "evil_plugin" not in sys.modules
