"""``prompt_attention: bidirectional`` (mutor2d.model.attention.open_prefix): prompt tokens see the whole prompt
(padding excluded) and never an answer token or a register; answer tokens stay causal; registers keep
their rule. For the image GPT with a prompt prefix and for tiny Llama, Gemma-2, Mistral, Qwen-2 and GPT-2
models; cached generation (a bidirectional prefill, then ordinary decoding) equals a full recompute
under the same rule; a saved run generates that way without being told; the paper configs use it."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_lm import DENSE, FAMILIES, framed, ragged_batch, run_layout  # noqa: E402

from mutor2d.model.attention import NEVER, Visibility, causal_rule, open_prefix  # noqa: E402
from mutor2d.lm import hf  # noqa: E402
from mutor2d.lm.model import MutorLM, attention_mask  # noqa: E402
from mutor2d.objectives.layout import make_layout, regular_position_ids  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_open_prefix_by_hand():
    """P = 3, regular inputs 0..5, registers anchored at the last prefix token (limit 2) and at body
    token 1 (limit 4): prompt rows open to columns 0..2; every other row as before."""
    rank = torch.tensor([[0, 1, 2, 3, 4, 5, NEVER, NEVER]])
    vis = open_prefix(Visibility(rank, torch.tensor([[0, 1, 2, 3, 4, 5, 2, 4]]), num_regular=6), 3)
    assert vis.query_limit.tolist() == [[2, 2, 2, 3, 4, 5, 2, 4]] and vis.num_regular is None
    rows = vis.dense_mask()[0, 0].int().tolist()
    assert rows[0] == rows[1] == rows[2] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert rows[3] == [1, 1, 1, 1, 0, 0, 0, 0] and rows[6] == [1, 1, 1, 0, 0, 0, 1, 0]
    assert rows[7] == [1, 1, 1, 1, 1, 0, 0, 1]
    assert torch.equal(open_prefix(causal_rule(1, 6), 1).query_limit, causal_rule(1, 6).query_limit)



def test_open_prefix_with_a_length_per_row_opens_each_row_as_its_own_length_would():
    """Right-padded rows of prompt lengths 1, 3, 4 (real lengths 5, 4, 6 of width 6, padding never seen,
    limit -1): per-row P equals opening each row alone with its scalar P, and the padding stays shut."""
    P, N = torch.tensor([1, 3, 4]), torch.tensor([5, 4, 6])
    i = torch.arange(6)[None]
    real = i < N[:, None]
    vis = Visibility(torch.where(real, i, NEVER), torch.where(real, i, -1))
    opened = open_prefix(vis, P)
    for b in range(3):
        alone = open_prefix(Visibility(vis.key_rank[b:b + 1], vis.query_limit[b:b + 1]), int(P[b]))
        assert torch.equal(opened.query_limit[b:b + 1], alone.query_limit), b
    assert opened.query_limit.tolist() == [[0, 1, 2, 3, 4, -1], [2, 2, 2, 3, -1, -1], [3, 3, 3, 3, 4, 5]]


# ----------------------------------------------------------------------------- language models

def _prompt_rows(batch, b):
    """Canonical slots of sample b's real prompt tokens."""
    P_max = int(batch.prompt_len.max())
    return list(range(P_max - int(batch.prompt_len[b]), P_max))


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lm_prompt_tokens_see_the_prompt_and_nothing_else(family, side):
    """Sample 0 (prompt 3, answer 6): its first prompt token's output changes with its last prompt
    token under bidirectional (not under causal), never with an answer input or a register input;
    answer and register rows of the physical mask are the causal model's."""
    lm = FAMILIES[family]()
    out = {}
    for rule in ("causal", "bidirectional"):
        view, canon, lay = framed(MutorLM(lm, prompt_attention=rule).eval(), ragged_batch(), DENSE, side)
        P, T = canon.prefix.shape[1], lay.num_regular
        prompt = _prompt_rows(ragged_batch(), 0)
        with torch.no_grad():
            base = run_layout(view, canon, lay)
            changed = {}
            for what in ("last prompt token", "answer input", "registers"):
                h = view.embed(canon.body[:, :T - P], canon.prefix, lay.num_registers)
                if what == "last prompt token":
                    h[0, prompt[-1]] = torch.randn(h.shape[-1])
                elif what == "answer input":
                    h[0, P + 1] = torch.randn(h.shape[-1])
                else:
                    h[:, T:] = torch.randn(h.shape[0], h.shape[1] - T, h.shape[-1])
                new = view.hidden(h, lay.position_ids, lay.visibility)
                changed[what] = not torch.allclose(new[0, prompt[0]], base[0, prompt[0]], atol=1e-6)
        masks = view.frame.visibility(view._prompt_rule(lay.visibility, base)).dense_mask()[:, 0]
        out[rule] = changed, masks
    assert out["bidirectional"][0] == {"last prompt token": True, "answer input": False, "registers": False}
    assert out["causal"][0] == {"last prompt token": False, "answer input": False, "registers": False}
    f = view.frame
    prompt_slot = torch.zeros_like(f.real)
    for b in range(3):
        prompt_slot[b] = f.real[b] & (f.index[b] < canon.prefix.shape[1])
    causal_m, bi_m = out["causal"][1], out["bidirectional"][1]
    keep = ~torch.cat([prompt_slot, torch.zeros(3, bi_m.shape[1] - f.num_regular, dtype=torch.bool)], 1)
    assert torch.equal(causal_m[keep], bi_m[keep]) and not torch.equal(causal_m, bi_m)


def _reference_greedy(lm, ids, mask, steps):
    """Greedy tokens and step logits by full recompute: every step runs the whole left-padded sequence
    under the rule (prompt open, answer causal, padding never seen), window included."""
    ids, mask, P_end = ids.clone(), mask.clone(), ids.shape[1]
    tokens, logits = [], []
    for _ in range(steps):
        L = ids.shape[1]
        real = mask.bool()
        i = torch.arange(L).expand_as(ids)
        vis = open_prefix(Visibility(torch.where(real, i, NEVER), torch.where(real, i, -1)), P_end)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        with torch.no_grad():
            out = lm(input_ids=ids, attention_mask=attention_mask(lm.config, vis, pos, torch.float32),
                     position_ids=pos).logits[:, -1]
        nxt = out.argmax(-1)
        tokens.append(nxt), logits.append(out)
        ids, mask = torch.cat([ids, nxt[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return torch.stack(tokens, 1), torch.stack(logits, 1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cached_generation_equals_a_full_recompute(family):
    """A bidirectional prefill (hf.prefill_prompts) then the model's own cached greedy decoding: the
    tokens and every step's logits of a full recompute, on a left-padded batch; the causal prefill's
    first logits differ (the rule matters)."""
    lm = FAMILIES[family]()
    lm.generation_config.eos_token_id = None                  # 4 steps whatever is drawn
    ids = torch.tensor([[0, 0, 5, 9, 7, 11], [6, 8, 10, 12, 14, 3]])
    mask = (torch.arange(6) >= torch.tensor([[2], [0]])).long()
    with torch.no_grad():
        out = lm.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=4,
                          pad_token_id=0, output_logits=True, return_dict_in_generate=True,
                          **{hf.cache_kwarg(lm): hf.prefill_prompts(lm, ids, mask)})
        causal = lm.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=1, pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
    tokens, logits = _reference_greedy(lm, ids, mask, 4)
    assert torch.equal(out.sequences[:, 6:], tokens)
    torch.testing.assert_close(torch.stack(out.logits, 1), logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(causal.logits[0], logits[:, 0], atol=1e-4)


def test_a_saved_bidirectional_run_generates_that_way_without_being_told(tmp_path):
    """A tiny Llama fine-tuned with prompt_attention bidirectional: the saved folder records it, and
    load_for_inference + hf.generate (what eval/lm_accuracy.py runs) match the full recompute; the
    folder also loads in plain transformers (which prefills causally)."""
    import mutor2d.lm as lm_pkg
    from test_lm import _write_tiny_model
    from mutor2d.lm.offline_tokenizers import char_tokenizer
    tok = char_tokenizer("0123456789+=;:sum ")
    _write_tiny_model(tmp_path / "base", tok)
    cfg = {"task": "lm", "model": {"hf": str(tmp_path / "base"), "finetune": "full", "prompt_attention": "bidirectional"},
           "data": {"path": str(ROOT / "tests" / "data" / "lm_tiny.jsonl")},
           "objective": {"name": "mutor-1d", "d_max": 3}, "optim": {"lr": 1e-3},
           "train": {"batch_size": 4, "max_steps": 2, "tracker": "none"}}
    lm_pkg.train(cfg, tmp_path / "run")
    assert json.loads((tmp_path / "run" / hf.INFERENCE_FILE).read_text()) == {"prompt_attention": "bidirectional"}
    model = hf.load_for_inference(tmp_path / "run")
    assert getattr(model, hf.PROMPT_ATTR) == "bidirectional"
    prompts = [tok.encode("12+3="), tok.encode("1+1=")]
    texts = hf.generate(model, tok, prompts, 5)
    padded = tok.pad({"input_ids": prompts}, padding=True, padding_side="left", return_tensors="pt")
    tokens, _ = _reference_greedy(model, padded["input_ids"], padded["attention_mask"], 5)
    until_eos = [row[:row.index(tok.eos_token_id)] if tok.eos_token_id in row else row for row in tokens.tolist()]
    assert texts == tok.batch_decode(until_eos, skip_special_tokens=True)
    model.generation_config.eos_token_id = None                       # model.generate itself, as a user calls it
    sequences = model.generate(**padded, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.equal(sequences[:, padded["input_ids"].shape[1]:], tokens)


def test_every_paper_config_prompts_bidirectionally():
    """The sft_gsm8k_* and sft_math_* configs (both model sizes, every objective, LoRA twins): the
    authors trained and evaluated with bidirectional prompt attention."""
    from mutor2d.lm.config import load
    names = sorted(p.name for p in (ROOT / "configs").glob("sft_*.yaml") if p.name.startswith(("sft_gsm8k", "sft_math")))
    assert len(names) >= 16
    assert {n: load(n).model.prompt_attention for n in names} == {n: "bidirectional" for n in names}


# ----------------------------------------------------------------------------- the image GPT

def _prompt_gpt(rule: str):
    from mutor2d.model.gpt import GPT
    from mutor2d.model.config import ModelConfig
    torch.manual_seed(0)
    cfg = ModelConfig(preset="custom", n_layer=2, n_head=2, dim=32, vocab_size=24, conditioning="prompt", rope="1d",
                      token_dropout=0, resid_dropout=0, ffn_dropout=0, class_dropout=0, prompt_attention=rule)
    model = GPT(cfg, register_token=True).eval()
    with torch.no_grad():                     # the output head starts at zero: logits would say nothing
        model.output.weight.normal_(0, 0.2)
    return model


def test_image_gpt_prompt_tokens_see_the_prompt_and_nothing_else():
    """A prompt prefix of 4 on a 1 x 6 line with MuToR-1D registers: as for language models."""
    P, N = 4, 6
    prefix, body = torch.randint(0, 24, (2, P)), torch.randint(0, 24, (2, N))
    lay = make_layout(2, (1, N), P, DENSE, torch.Generator().manual_seed(0))
    T = lay.num_regular
    result = {}
    for rule in ("causal", "bidirectional"):
        model = _prompt_gpt(rule)
        with torch.no_grad():
            h = model.embed(body[:, :N - 1], prefix, lay.num_registers)
            base = model.hidden(h, lay.position_ids, lay.visibility, prefix_len=P)
            changed = {}
            for what, slots in (("last prompt token", [P - 1]), ("answer input", [P + 1]), ("registers", range(T, h.shape[1]))):
                g = h.clone()
                g[:, list(slots)] = torch.randn(len(slots), h.shape[-1])
                new = model.hidden(g, lay.position_ids, lay.visibility, prefix_len=P)
                changed[what] = not torch.allclose(new[:, 0], base[:, 0], atol=1e-6)
            late = h.clone()
            late[:, T - 1] = torch.randn(h.shape[-1])                   # the last regular input
            answer_causal = torch.allclose(model.hidden(late, lay.position_ids, lay.visibility, prefix_len=P)[:, P:T - 1],
                                           base[:, P:T - 1], atol=1e-6)
        result[rule] = changed, answer_causal
    assert result["bidirectional"] == ({"last prompt token": True, "answer input": False, "registers": False}, True)
    assert result["causal"] == ({"last prompt token": False, "answer input": False, "registers": False}, True)
    with pytest.raises(ValueError, match="must pass prefix_len"):
        _prompt_gpt("bidirectional").hidden(h, lay.position_ids, lay.visibility)


def test_image_gpt_prefill_equals_the_full_forward():
    """GPT.decode's prefill of a prompt (then one cached step) gives the logits of the full forward
    under the same rule; with one prefix slot (a class token) bidirectional changes nothing."""
    P, N = 4, 3
    model = _prompt_gpt("bidirectional")
    prefix, body = torch.randint(0, 24, (1, P)), torch.randint(0, 24, (1, N))
    pos = regular_position_ids((1, N + 1), P)[None]                                   # (1, P + N, 2)
    with torch.no_grad():
        full = model(body, pos[:, :P + N], prefix)
        model.setup_cache(1, P + N)
        first = model.decode(None, pos[:, :P], 0, prefix)
        step = model.decode(body[:, :1], pos[:, P:P + 1], P)
        model.clear_cache()
        causal = _prompt_gpt("causal")(body, pos[:, :P + N], prefix)
    torch.testing.assert_close(first[:, -1], full[:, P - 1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step[:, 0], full[:, P], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(causal[:, P - 1], full[:, P - 1], atol=1e-4)
