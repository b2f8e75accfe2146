"""MuToR-1D through transformers causal LMs (mutor2d.lm): tiny models built offline."""
import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM)

import mutor2d.lm as lm_pkg  # noqa: E402
from mutor2d.lm import hf  # noqa: E402
from mutor2d import config as image_config  # noqa: E402
from mutor2d.config import ConfigError, make  # noqa: E402
from mutor2d.engine.data_order import StepBatches  # noqa: E402
from mutor2d.lm.config import LMModelConfig, is_lm_config, load  # noqa: E402
from mutor2d.lm.offline_tokenizers import char_tokenizer
from mutor2d.lm.prompts import eval_prompts, tokenize
from mutor2d.lm.records import gsm8k_record, load_located, load_records
from mutor2d.lm.packing import collate
from mutor2d.lm.model import MutorLM, frame_batch  # noqa: E402
from mutor2d.lm.packing import LMBatch  # noqa: E402
from mutor2d.lm.run import LMTrainModule  # noqa: E402
from mutor2d.objectives.token_prediction import TokenPrediction  # noqa: E402
from mutor2d.objectives.spec import RegisterSpec, RegisterSpec1D  # noqa: E402
from mutor2d.objectives.layout import make_layout, offset_targets, regular_position_ids  # noqa: E402
from timeouts import limit  # noqa: E402

VOCAB = 40
DENSE = RegisterSpec1D(d_min=1, d_max=4)
SPARSE = RegisterSpec1D(d_min=1, d_max=4, placement="sparse", num_registers=3)


def tiny_llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
                                        eos_token_id=2)).eval()


def tiny_gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                      bos_token_id=1, eos_token_id=2)).eval()


def tiny_sliding(family):
    """Gemma 2 (logit soft-capping, per-layer-type masks) or Mistral, with a 3-token window."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM
    cfg_cls, model_cls = {"gemma2": (Gemma2Config, Gemma2ForCausalLM),
                          "mistral": (MistralConfig, MistralForCausalLM)}[family]
    torch.manual_seed(0)
    return model_cls(cfg_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=3,
                             max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()


def tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()


FAMILIES = {"llama": tiny_llama, "gpt2": tiny_gpt2, "gemma2": lambda: tiny_sliding("gemma2"),
            "mistral": lambda: tiny_sliding("mistral"), "qwen2": tiny_qwen2}


def ragged_batch() -> LMBatch:
    """Three samples with different prompt (3, 5, 2) and answer (6, 2, 4) lengths."""
    prompt = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12], [13, 14, 0, 0, 0]])
    answer = torch.tensor([[20, 21, 22, 23, 24, 25], [26, 27, 0, 0, 0, 0], [28, 29, 30, 31, 0, 0]])
    return LMBatch(prompt, torch.tensor([3, 5, 2]), answer, torch.tensor([6, 2, 4]))


def framed(model, batch, spec, side, seed=1):
    """(the model on the batch's frame, the canonical batch, the layout TokenPrediction draws there)."""
    view, canon = frame_batch(model, batch, spec, side, "cpu")
    lay = make_layout(canon.body.shape[0], canon.grid, view.prefix_len(canon.prefix), spec,
                      torch.Generator().manual_seed(seed), canon.lengths)
    return view, canon, lay


def run_layout(view, canon, lay):
    """(B, T_can + R, D) canonical hidden states of the layout's sequence."""
    P = canon.prefix.shape[1]
    h = view.embed(canon.body[:, :lay.num_regular - P], canon.prefix, lay.num_registers)
    return view.hidden(h, lay.position_ids, lay.visibility)


def physical_inputs(view, canon):
    """(input ids (B, T), position ids (B, T)) of the physical regular slots, for the plain model."""
    f, T_can = view.frame, view.frame.num_canonical
    ids = torch.cat([canon.prefix, canon.body], 1)[:, :T_can]
    pos = regular_position_ids(canon.grid, canon.prefix.shape[1])[:, 1].expand(ids.shape[0], T_can)
    return f.regular(ids, 0), f.positions(pos)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_regular_logits_equal_plain_model(family):
    lm = FAMILIES[family]()
    model = MutorLM(lm).eval()
    losses = {}
    for side in ("left", "right"):
        for spec in (DENSE, SPARSE, RegisterSpec()):
            view, canon, lay = framed(model, ragged_batch(), spec, side)
            f = view.frame
            assert (lay.num_registers > 0) == spec.uses_registers()
            with torch.no_grad():
                res = TokenPrediction(spec, 0.5)(view, canon, torch.Generator().manual_seed(1))
                losses.setdefault(spec, []).append(res.loss)
                ours = model.logits(f.regular(run_layout(view, canon, lay)[:, :lay.num_regular], 0.0))
                ids, pos = physical_inputs(view, canon)
                ref = lm(input_ids=ids, attention_mask=f.real.long(), position_ids=pos).logits
            torch.testing.assert_close(ours[f.real], ref[f.real], atol=1e-5, rtol=1e-5)
    for left, right in losses.values():                   # the padding side changes nothing
        torch.testing.assert_close(left, right)


def test_register_sees_its_anchor_and_nothing_later():
    model = MutorLM(tiny_llama()).eval()
    batch = ragged_batch()
    view, canon, lay = framed(model, batch, DENSE, "left", seed=0)
    f, R = view.frame, lay.num_registers
    mask, T = f.visibility(lay.visibility).dense_mask()[:, 0], f.num_regular
    lead = T - (batch.prompt_len + batch.answer_len - 1)
    for b in range(3):
        for r in range(R):
            row = mask[b, T + r]
            assert row[T:].tolist() == [k == r for k in range(R)]   # itself only
            if not lay.reg_valid[b, r]:
                continue
            last = int(lead[b] + batch.prompt_len[b] + lay.reg_anchor[b, r])  # anchor slot
            assert row[:T].tolist() == [int(lead[b]) <= s <= last for s in range(T)]
    # functional: changing an answer input after the anchor leaves the register's output unchanged
    with torch.no_grad():
        before = run_layout(view, canon, lay)
        canon.body[0, 4] = 33                              # a_4, the last answer input of sample 0
        after = run_layout(view, canon, lay)
    T_can = f.num_canonical
    for r in range(R):
        if lay.reg_valid[0, r]:
            same = torch.allclose(before[0, T_can + r], after[0, T_can + r])
            assert same == bool(lay.reg_anchor[0, r] < 4)


@pytest.mark.parametrize("side", ["left", "right"])
def test_targets_and_positions_at_answer_edges(side):
    # sample 0: P=3, N=4; sample 1: P=1, N=2; offset d = 2 only
    batch = LMBatch(torch.tensor([[5, 6, 7], [8, 0, 0]]), torch.tensor([3, 1]),
                    torch.tensor([[20, 21, 22, 23], [24, 25, 0, 0]]), torch.tensor([4, 2]))
    spec = RegisterSpec1D(d_min=2, d_max=2)
    view, canon, lay = framed(MutorLM(tiny_llama()), batch, spec, side)
    f, T = view.frame, 6
    ids, pos_regular = physical_inputs(view, canon)
    pos = f.positions(lay.position_ids[..., 1])
    lead1 = 4 if side == "left" else 0
    assert f.num_regular == T and ids[0].tolist() == [5, 6, 7, 20, 21, 22]
    assert ids[1, lead1:lead1 + 2].tolist() == [8, 24]
    assert pos[0, :T].tolist() == pos_regular[0].tolist() == [0, 1, 2, 3, 4, 5]
    assert pos[1, lead1:lead1 + 2].tolist() == [0, 1]
    # next-token targets: the last prompt token predicts a_0, the last input predicts a_{N-1}
    ntp_tok, reg_targets = lay.gather_targets(canon.body)
    ntp_mask, ntp_targets = f.regular(lay.ntp_valid, False), f.regular(ntp_tok, 0)
    assert ntp_mask[0].tolist() == [False, False, True, True, True, True]
    assert ntp_targets[0, 2:].tolist() == [20, 21, 22, 23]
    assert ntp_targets[1, lead1:lead1 + 2].tolist() == [24, 25] and int(ntp_mask[1].sum()) == 2
    # registers: anchors t = -1, 0, 1 predict a_1, a_2, a_3 at positions P-1+target
    valid0 = lay.reg_valid[0]
    assert lay.reg_anchor[0][valid0].tolist() == [-1, 0, 1]
    assert reg_targets[0][valid0].tolist() == [21, 22, 23]
    assert pos[0, T:][valid0].tolist() == [3, 4, 5]
    valid1 = lay.reg_valid[1]                             # only t = -1 -> a_1 fits in N = 2
    assert reg_targets[1][valid1].tolist() == [25] and pos[1, T:][valid1].tolist() == [1]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_lora_trains_only_adapters_and_register_embedding(checkpointing):
    model = hf.build(tiny_llama(), LMModelConfig(hf="x", lora_targets=["q_proj", "v_proj"],
                                                 gradient_checkpointing=checkpointing),
                     make("objective", name="mutor-1d"))
    model.train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "register_embedding" in trainable
    assert all(n == "register_embedding" or ".lora_" in n for n in trainable) and len(trainable) > 1
    step = LMTrainModule(model, make("objective", name="mutor-1d"), "right")
    step(ragged_batch(), torch.Generator().manual_seed(0)).loss.backward()
    with_grad = {n for n, q in model.named_parameters() if q.grad is not None}
    assert with_grad == trainable


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_save_load_round_trip(tmp_path, finetune):
    base = tiny_llama()
    base.save_pretrained(tmp_path / "base")
    lm = hf.load_causal_lm(tmp_path / "base")
    model = hf.build(lm, LMModelConfig(hf="x", finetune=finetune, lora_targets=["q_proj", "v_proj"]),
                     make("objective", name="mutor-1d"))
    with torch.no_grad():
        for n, q in model.named_parameters():
            if q.requires_grad:
                q.add_(0.1 * torch.randn_like(q))
    model.eval()
    hf.save(model, tmp_path / "out")
    names = {f.name for f in (tmp_path / "out").iterdir()}
    assert "register_embedding.safetensors" in names
    assert ("adapter_model.safetensors" if finetune == "lora" else "model.safetensors") in names
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True).eval()
    x = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(plain(x).logits, model.lm(x).logits)
        assert plain.generate(x, max_new_tokens=3, do_sample=False).shape == (1, 8)
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "out" / hf.REGISTER_FILE))["register_embedding"]
    torch.testing.assert_close(saved, model.register_embedding)


def _write_tiny_model(folder, tokenizer):
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
                                 eos_token_id=2)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _tiny_run(tmp_path, finetune, steps, lr):
    _write_tiny_model(tmp_path / "base", char_tokenizer("0123456789+=;:sum "))
    cfg = {"task": "lm", "model": {"hf": str(tmp_path / "base"), "finetune": finetune,
                                   "lora_targets": ["q_proj", "v_proj"]},
           "data": {"path": str(Path(__file__).parent / "data" / "lm_tiny.jsonl"), "padding_side": "left"},
           "optim": {"lr": lr}, "train": {"batch_size": 8, "max_steps": steps, "log_every": 1, "tracker": "none"}}
    out = lm_pkg.train(cfg, tmp_path / "run")
    assert (out / "register_embedding.safetensors").is_file() and (out / "config.yaml").is_file()
    return out, [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_overfits_tiny_jsonl_under_mutor(tmp_path):
    out, rows = _tiny_run(tmp_path, "full", 60, 3e-3)
    assert "loss_reg" in rows[0] and len(rows) == 60
    assert rows[-1]["loss"] < 0.3 * rows[0]["loss"], (rows[0], rows[-1])


def test_lora_training_run_saves_adapters(tmp_path):
    out, rows = _tiny_run(tmp_path, "lora", 3, 1e-2)
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


def test_data_gsm8k_and_tokenize(tmp_path):
    raw = tmp_path / "g.jsonl"
    raw.write_text(json.dumps({"question": "1+1?", "answer": "2\n#### 2"}) + "\n")
    recs = load_records("gsm8k", raw)
    assert recs == [gsm8k_record({"question": "1+1?", "answer": "2\n#### 2"})]
    assert recs[0]["prompt"].startswith("Question: 1+1?") and recs[0]["answer"].startswith(" 2")
    tok = char_tokenizer("0123456789+?#: \nQuestionAnswer")
    text = recs[0]["prompt"] + recs[0]["answer"]                      # one id per character, newlines too
    assert tok.unk_token_id not in tok(text)["input_ids"] and tok.decode(tok(text)["input_ids"][1:]) == text
    [(prompt, answer)] = tokenize(recs, tok, 8, 100)
    assert len(prompt) == 8 and answer[-1] == tok.eos_token_id      # prompt keeps its last 8 tokens
    batch = collate([(prompt, answer), ([1, 4], [5, 6])], pad_id=0)
    assert batch.prompt_len.tolist() == [8, 2] and batch.answer.shape == (2, len(answer))


def test_one_line_errors(tmp_path):
    with pytest.raises(hf.LMModelError, match="no transformers model at") as e:
        hf.load_causal_lm(tmp_path / "missing")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="unknown config key 'objective.d_mix'"):
        load({"model": {"hf": "m"}, "data": {"path": "d"}, "objective": {"d_mix": 2}})
    with pytest.raises(ConfigError, match="data.padding_side: expected one of .*got 'middle'"):
        load({"model": {"hf": "m"}, "data": {"path": "d"}}, ["data.padding_side=middle"])
    with pytest.raises(ConfigError, match="optim.lr: expected a finite number, got nan"):
        load({"model": {"hf": "m"}, "data": {"path": "d"}}, ["optim.lr=.nan"])
    with pytest.raises(ConfigError, match=r"^objective 'mutor-2d': 2D offsets need a 2D grid, got a 1 x N line "
                                          r"\(text\) \(use 1D offsets\)$"):
        load({"model": {"hf": "m"}, "data": {"path": "d"}}, ["objective.name=mutor-2d"])
    with pytest.raises(ConfigError, match=r"objective.name: expected one of \[.*'mutor-2d'.*\], got 'nope'"):
        load({"model": {"hf": "m"}, "data": {"path": "d"}}, ["objective.name=nope"])
    assert is_lm_config("sft_gsm8k_mutor.yaml") and not is_lm_config("digits_ntp.yaml")
    assert load("sft_gsm8k_ntp.yaml").objective.name == "ntp"


@pytest.mark.parametrize("overrides", [["objective.d_max=0"], ["objective.reg_weight=.nan"],
                                       ["objective.reg_weight=1.5"], ["objective.num_registers=0",
                                                                      "objective.placement=sparse"]])
def test_objective_errors_match_image_config(overrides):
    """The LM objective section is the shared mutor-1d variant: same checks, same one-line message."""
    with pytest.raises(ConfigError) as image:
        image_config.load(None, ["objective.name=mutor-1d", *overrides])
    with pytest.raises(ConfigError) as lm:
        load({"model": {"hf": "m"}, "data": {"path": "d"}, "objective": {"name": "mutor-1d"}}, overrides)
    assert str(lm.value) == str(image.value) and "\n" not in str(lm.value)


def test_yaml_configs_load_and_round_trip():
    for name in ("sft_gsm8k_mutor.yaml", "sft_gsm8k_ntp.yaml", "sft_stargraph_mutor.yaml"):
        cfg = load(name)
        assert type(cfg.objective) is type(image_config.make("objective", name=cfg.objective.name))
        assert load(cfg) == cfg and load(cfg.to_dict()) == cfg
    cfg = load("sft_gsm8k_mutor.yaml", ["objective.name=ntp"])        # switching drops mutor-1d fields
    assert cfg.objective.name == "ntp" and cfg.optim.betas == (0.9, 0.999)


def test_length_grouped_step_batches_cover_each_sample_once_and_group_lengths():
    lengths = torch.tensor([5, 50, 6, 51, 7, 52, 8, 53])
    grouped = StepBatches(8, 2, 1, 0, 1, seed=0, start=0, end=4, lengths=lengths, chunk=8)
    plain = StepBatches(8, 2, 1, 0, 1, seed=0, start=0, end=4)
    spread = {}
    for name, sampler in (("grouped", grouped), ("plain", plain)):
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(8))
        spread[name] = sum(int(lengths[b].max() - lengths[b].min()) for b in batches)
    assert spread["grouped"] < 20 < spread["plain"], spread
    again = StepBatches(8, 2, 1, 0, 1, seed=0, start=2, end=4, lengths=lengths, chunk=8)
    assert list(again) == list(grouped)[2:]                       # a resumed run reads the same batches


@pytest.mark.usefixtures("one_thread")               # the in-process runs match the 1-thread subprocess
def test_lm_run_stops_on_sigterm_and_resumes_exactly(tmp_path):
    """A language-model run is an engine run: SIGTERM -> checkpoint, exit 75 -> --resume auto gives the
    losses and final weights of an uninterrupted run of the same steps; a plain rerun is refused. Only
    the stopped run is a process of its own (the others train in this one: no second model load)."""
    import yaml
    from safetensors.torch import load_file

    from test_training import PY, losses, losses_so_far, stop_after

    _write_tiny_model(tmp_path / "base", char_tokenizer("0123456789+=;:sum "))
    cfg = {"task": "lm", "model": {"hf": str(tmp_path / "base"), "finetune": "lora", "lora_targets": ["q_proj"]},
           "data": {"path": str(Path(__file__).parent / "data" / "lm_tiny.jsonl"), "padding_side": "left"},
           "objective": {"name": "mutor-1d", "placement": "sparse", "num_registers": 3},
           "optim": {"lr": 1e-2}, "train": {"batch_size": 4, "max_steps": 100000, "log_every": 1,
                                           "ckpt_every": 0, "tracker": "none"}}
    (tmp_path / "lm.yaml").write_text(yaml.safe_dump(cfg))
    run, straight = tmp_path / "run", tmp_path / "straight"
    rc, err = stop_after([PY, "train.py", "--config", str(tmp_path / "lm.yaml"), "--out", str(run)], run, 2)
    assert rc == 75, err[-2000:]
    k = max(losses_so_far(run))
    more = [f"train.max_steps={k + 2}"]
    with pytest.raises(ConfigError, match="already has checkpoints"):               # nothing overwritten
        lm_pkg.train(cfg, run, more)
    lm_pkg.train(cfg, run, more, resume="auto")
    lm_pkg.train(cfg, straight, more)
    assert losses(run) == losses(straight) and len(losses(run)) == k + 2
    for name in ("adapter_model.safetensors", "register_embedding.safetensors"):
        a, b = load_file(str(run / name)), load_file(str(straight / name))
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_a_pickle_payload_in_model_weights_is_refused_in_one_line(tmp_path):
    """A pytorch_model.bin that would run code on load: one line naming the folder, nothing runs."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1).save_pretrained(tmp_path / "m")
    torch.save({"model.embed_tokens.weight": Payload()}, tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(hf.LMModelError, match="pickled Python objects beyond tensors") as e:
        hf.load_causal_lm(tmp_path / "m")
    assert "\n" not in str(e.value) and not marker.exists()


def test_lm_rejects_a_pair_longer_than_the_model_positions_before_loading(tmp_path, monkeypatch):
    _write_tiny_model(tmp_path / "base", char_tokenizer("0123456789+=;:sum "))      # 128 positions
    lines = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1+" * 70, "answer": "3" * 20}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    monkeypatch.setattr(hf, "load_causal_lm", lambda *a, **k: pytest.fail("the model was loaded"))
    cfg = {"task": "lm", "model": {"hf": str(tmp_path / "base")}, "data": {"path": str(tmp_path / "d.jsonl")},
           "train": {"batch_size": 2, "max_steps": 1, "tracker": "none"}}
    with pytest.raises(ConfigError, match=r"d.jsonl:2: 141 \+ 21 = 162 prompt \+ answer tokens, more than the "
                                          r"model's 128 positions") as e:
        lm_pkg.train(cfg, tmp_path / "run")
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- multi-head baseline

MULTIHEAD = {"name": "multihead", "d_max": 4, "reg_weight": 0.3}


def _multihead(finetune="full", lm=None):
    cfg = load({"model": {"hf": "x"}, "data": {"path": "d"}, "objective": MULTIHEAD})
    return hf.build(lm or tiny_llama(), LMModelConfig(hf="x", finetune=finetune, lora_targets=["q_proj", "v_proj"]),
                    cfg.objective)


def test_multihead_regular_logits_equal_plain_model_and_heads_start_as_its_last_layer():
    lm = tiny_llama()
    plain = LlamaForCausalLM(lm.config).eval()
    plain.load_state_dict(lm.state_dict())
    model = _multihead(lm=lm).eval()
    objective = LMTrainModule(model, load({"model": {"hf": "x"}, "data": {"path": "d"}, "objective": MULTIHEAD})
                              .objective, "left").objective
    assert objective.offsets[:, 1].tolist() == [2, 3, 4] and len(model.heads) == 3 and not model.has_registers
    assert objective.heads is None and not list(objective.parameters())     # the heads are the model's
    view, canon = frame_batch(model, ragged_batch(), RegisterSpec(), "left", "cpu")
    f, T_can, P = view.frame, view.frame.num_canonical, canon.prefix.shape[1]
    emb = view.embed(canon.body[:, :T_can - P], canon.prefix)
    pos = regular_position_ids(canon.grid, P).expand(3, T_can, 2)
    ids, pos_ids = physical_inputs(view, canon)
    with torch.no_grad():
        h, heads = view.hidden_with_heads(emb, pos)
        ours = model.logits(f.regular(h, 0.0))
        ref = plain(input_ids=ids, attention_mask=f.real.long(), position_ids=pos_ids).logits
        torch.testing.assert_close(ours[f.real], ref[f.real], atol=1e-5, rtol=1e-5)
        for hk in heads:         # a copy of the last layer on the last layer's inputs: the next-token path
            torch.testing.assert_close(model.logits(f.regular(hk, 0.0))[f.real], ours[f.real])
        model.heads[0].mlp.down_proj.weight.add_(0.1)          # the heads are their own weights
        h2, heads2 = view.hidden_with_heads(emb, pos)
        assert not torch.allclose(model.logits(f.regular(heads2[0], 0.0))[f.real], ours[f.real])
        torch.testing.assert_close(h2, h)
        torch.testing.assert_close(view.hidden(emb, pos), h)


@pytest.mark.parametrize("side", ["left", "right"])
def test_multihead_targets_at_answer_edges(side):
    """Head at offset d on anchor a_t predicts a_{t+d} (t = -1 the last prompt token), on the canonical
    line the objective reads; its count is the sum of those targets."""
    batch = LMBatch(torch.tensor([[5, 6, 7], [8, 0, 0]]), torch.tensor([3, 1]),
                    torch.tensor([[20, 21, 22, 23], [24, 25, 0, 0]]), torch.tensor([4, 2]))
    expect = {2: ([-1, 0, 1], [21, 22, 23], [25]), 3: ([-1, 0], [22, 23], []), 4: ([-1], [23], []),
              6: ([], [], [])}
    view, canon = frame_batch(MutorLM(tiny_llama()), batch, RegisterSpec(), side, "cpu")
    anchors = torch.arange(-1, canon.grid[1] - 1).expand(2, -1)
    for d, (anchors0, targets0, targets1) in expect.items():
        target, valid = offset_targets(canon.grid, anchors, torch.tensor([0, d]), "geometric", canon.lengths)
        assert anchors[0][valid[0]].tolist() == anchors0
        assert canon.body.gather(1, target)[0][valid[0]].tolist() == targets0
        assert canon.body.gather(1, target)[1][valid[1]].tolist() == targets1
    model = _multihead()
    cfg = load({"model": {"hf": "x"}, "data": {"path": "d"}, "objective": MULTIHEAD})
    res = LMTrainModule(model, cfg.objective, side)(batch)
    assert int(res.counts["heads"]) == 4 + 2 + 1 and int(res.counts["ntp"]) == 4 + 2


def test_multihead_under_lora_trains_heads_fully_and_trunk_by_adapters():
    model = _multihead("lora").train()
    trainable = {n for n, q in model.named_parameters() if q.requires_grad}
    heads = {n for n, _ in model.heads.named_parameters()}
    assert {f"heads.{n}" for n in heads} <= trainable and len(heads) > 0
    assert all(n.startswith("heads.") or ".lora_" in n for n in trainable)
    cfg = load({"model": {"hf": "x"}, "data": {"path": "d"}, "objective": MULTIHEAD})
    res = LMTrainModule(model, cfg.objective, "right")(ragged_batch())
    assert set(res.logs) == {"loss_ntp", "loss_heads"} and int(res.counts["heads"]) > 0
    torch.testing.assert_close(res.loss, 0.7 * res.logs["loss_ntp"] + 0.3 * res.logs["loss_heads"])
    res.loss.backward()
    assert {n for n, q in model.named_parameters() if q.grad is not None} == trainable


def test_multihead_loss_decreases_and_the_saved_folder_is_the_plain_model(tmp_path):
    _write_tiny_model(tmp_path / "base", char_tokenizer("0123456789+=;:sum "))
    cfg = {"task": "lm", "model": {"hf": str(tmp_path / "base"), "finetune": "full"},
           "data": {"path": str(Path(__file__).parent / "data" / "lm_tiny.jsonl")}, "objective": MULTIHEAD,
           "optim": {"lr": 3e-3}, "train": {"batch_size": 8, "max_steps": 15, "log_every": 1, "tracker": "none"}}
    out = lm_pkg.train(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert rows[-1]["loss_heads"] < 0.7 * rows[0]["loss_heads"] and rows[-1]["loss"] < 0.7 * rows[0]["loss"]
    from safetensors.torch import load_file
    assert not any("heads" in k for k in load_file(str(out / "model.safetensors")))
    AutoModelForCausalLM.from_pretrained(out, local_files_only=True)        # plain transformers


def test_multihead_run_resumes_with_its_heads(tmp_path):
    from test_training import losses
    from mutor2d import checkpoint as ckpt_lib
    _write_tiny_model(tmp_path / "base", char_tokenizer("0123456789+=;:sum "))
    cfg = {"task": "lm", "model": {"hf": str(tmp_path / "base"), "finetune": "lora", "lora_targets": ["q_proj"]},
           "data": {"path": str(Path(__file__).parent / "data" / "lm_tiny.jsonl")}, "objective": MULTIHEAD,
           "optim": {"lr": 1e-2}, "train": {"batch_size": 4, "max_steps": 2, "log_every": 1, "ckpt_every": 2,
                                           "tracker": "none"}}
    lm_pkg.train(cfg, tmp_path / "run")
    saved = ckpt_lib.load(ckpt_lib.checkpoint_path(tmp_path / "run", 2))["model"]
    assert any(k.startswith("heads.") for k in saved) and any(".lora_" in k for k in saved)
    lm_pkg.train(cfg, tmp_path / "run", ["train.max_steps=4"], resume="auto")
    lm_pkg.train(cfg, tmp_path / "straight", ["train.max_steps=4"])
    assert losses(tmp_path / "run") == losses(tmp_path / "straight") and len(losses(tmp_path / "run")) == 4


def test_multihead_config_rules():
    base = {"model": {"hf": "m"}, "data": {"path": "d"}}
    cfg = load({**base, "objective": {"name": "multihead"}})
    assert cfg.objective.layout == "1d" and load(cfg) == cfg
    with pytest.raises(ConfigError, match="^objective 'multihead': 2D offsets need a 2D grid, got a 1 x N line"):
        load({**base, "objective": {"name": "multihead", "layout": "2d"}})
    with pytest.raises(ConfigError, match="objective.d_max: the 1d heads predict d = 2..d_max, got 1"):
        load({**base, "objective": {"name": "multihead", "d_max": 1}})


# ----------------------------------------------------------------------------- online accuracy

def _eval_cfg(tmp_path, **train):
    _write_tiny_model(tmp_path / "base", char_tokenizer("0123456789+=;:sum "))
    data = str(Path(__file__).parent / "data" / "lm_tiny.jsonl")
    return {"task": "lm", "model": {"hf": str(tmp_path / "base"), "finetune": "lora", "lora_targets": ["q_proj"]},
            "data": {"path": data}, "objective": {"name": "mutor-1d"}, "optim": {"lr": 1e-2},
            "train": {"batch_size": 4, "max_steps": 4, "log_every": 1, "ckpt_every": 2, "eval_every": 2,
                      "tracker": "none", **train},
            "eval": {"path": data, "limit": 5, "max_new_tokens": 4, "batch_size": 2, "stop": [], "kind": "gsm8k"}}


def test_online_accuracy_every_n_steps_is_the_evaluator_and_leaves_training_alone(tmp_path, capsys):
    from mutor2d.evaluation import records
    from test_lm_accuracy import _script
    from test_training import losses
    cfg = _eval_cfg(tmp_path)
    out = lm_pkg.train(cfg, tmp_path / "run")
    recs, _ = records.read_records([out])
    printed = capsys.readouterr().out.splitlines()          # each evaluation is printed, and the end says so
    for r in sorted(recs, key=lambda r: r["step"]):
        assert f"step {r['step']}: evaluation accuracy {r['metrics']['accuracy']:.4g}, n 5" in printed
    assert printed[-1].startswith("done: steps 1-4 in ") and f"evaluation at step 4: accuracy " in printed[-1]
    assert sorted(r["step"] for r in recs) == [2, 4] and all(r["n"] == 5 for r in recs)
    assert " accuracy " in records.markdown_table(recs).splitlines()[0]           # eval/leaderboard.py's table
    logged = [r for r in (json.loads(line) for line in (out / "log.jsonl").read_text().splitlines())
              if "eval_accuracy" in r]
    assert [(r["step"], r["eval_accuracy"]) for r in logged] == \
        sorted((r["step"], r["metrics"]["accuracy"]) for r in recs)
    # the generation of eval/lm_accuracy.py (hf.generate on the saved step-2 folder) and its scoring
    tok = hf.load_tokenizer(out / "step_2")
    items = eval_prompts(load_located("jsonl", cfg["eval"]["path"])[:5], tok)
    texts = hf.generate(hf.load_for_inference(out / "step_2"), tok, [it["prompt_ids"] for it in items], 4)
    online = [json.loads(line) for line in (out / "eval" / "predictions_lm_tiny_step2.jsonl").read_text().splitlines()]
    assert [r["output"] for r in online] == texts
    scored = _script("lm_accuracy").main(["--score", str(out / "eval" / "predictions_lm_tiny_step2.jsonl"),
                                          "--kind", "gsm8k"])
    assert scored["accuracy"] == next(r for r in recs if r["step"] == 2)["metrics"]["accuracy"]
    plain = {**cfg, "train": {**cfg["train"], "eval_every": 0}, "eval": {}}
    lm_pkg.train(plain, tmp_path / "plain")
    assert losses(out) == losses(tmp_path / "plain")                 # evaluation does not move training


def test_online_accuracy_config_rules(tmp_path):
    base = {"model": {"hf": "m"}, "data": {"path": "d"}}
    with pytest.raises(ConfigError, match="train.eval_every: expected 0 unless eval.path names an evaluation file"):
        load(base, ["train.eval_every=5"])
    with pytest.raises(ConfigError, match="eval.max_new_tokens: expected >= 1"):
        load(base, ["eval.max_new_tokens=0"])
    cfg = _eval_cfg(tmp_path)
    cfg["eval"]["path"] = str(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="missing.jsonl'?: no such file"):
        lm_pkg.train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_online_accuracy_under_two_processes(tmp_path):
    """Each process answers its share, one barrier, the main one scores: no deadlock, every item once."""
    import subprocess

    import yaml

    from test_training import PY, ROOT, env
    cfg = _eval_cfg(tmp_path, max_steps=2, eval_every=1, ckpt_every=0)
    (tmp_path / "lm.yaml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([PY, "-m", "accelerate.commands.launch", "--main_process_port", "0", "--multi_gpu", "--num_processes", "2",
                        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                        str(ROOT / "train.py"), "--config", str(tmp_path / "lm.yaml"), "--out", str(tmp_path / "run")],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=limit(240))
    assert r.returncode == 0, r.stderr[-3000:]
    for step in (1, 2):
        pred = tmp_path / "run" / "eval" / f"predictions_lm_tiny_step{step}.jsonl"
        assert [json.loads(line)["index"] for line in pred.read_text().splitlines()] == list(range(5))
    assert not list((tmp_path / "run" / "eval").glob("*.part*"))


def test_every_shipped_lm_config_loads_and_the_paper_settings_hold():
    from mutor2d.config_files import CONFIG_DIR
    names = sorted(p.name for p in Path(CONFIG_DIR).glob("*.yaml") if is_lm_config(p.name))
    assert len(names) >= 17
    for name in names:
        cfg = load(name)
        assert load(cfg.to_dict()) == cfg, name
        paper = {"sft_gsm8k_gemma2b": (3735, 4, 0.3), "sft_gsm8k_llama3_8b": (3735, 4, 0.3),   # steps, d_max, a
                 "sft_math_gemma2b": (83525, 3, 0.2), "sft_math_llama3_8b": (83525, 4, 0.1)}
        stem = next((k for k in paper if name.startswith(k + "_")), None)
        if stem is None:
            continue
        steps, d_max, a = paper[stem]
        assert cfg.optim.lr == (5e-5 if "gemma2b" in name else 2e-5), name
        assert (cfg.train.batch_size, cfg.train.max_steps, cfg.optim.schedule) == (10, steps, "linear"), name
        assert cfg.optim.warmup_steps == math.ceil(0.1 * cfg.train.max_steps), name   # the authors round up
        if cfg.objective.name != "ntp":
            assert (cfg.objective.d_max, cfg.objective.reg_weight) == (d_max, a), name


def test_online_evaluation_of_a_sharded_run_loads():
    """A sharded run evaluates online too (tests/test_fsdp_lm.py runs it)."""
    cfg = load("sft_gsm8k_gemma2b_mutor.yaml", ["train.sharding=fsdp"])
    assert cfg.eval.path and cfg.train.eval_every and cfg.train.sharding == "fsdp"
    assert load("sft_gsm8k_llama3_8b_mutor.yaml").train.sharding == "fsdp"
