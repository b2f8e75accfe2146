"""Register-drafted decoding of Hugging Face causal LMs (mutor2d.lm.speculative): exact against plain
decoding (greedy token for token, sampling in distribution), the KV cache after every round is plain
decoding's, and eval/lm_accuracy.py --decode registers writes plain's outputs. Tiny models, offline."""
import json
import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          Qwen2Config, Qwen2ForCausalLM)

import mutor2d.lm as lm_pkg  # noqa: E402
from mutor2d.config import ConfigError, make  # noqa: E402
from mutor2d.lm import drafter, hf  # noqa: E402
from mutor2d.lm.drafter import Registers  # noqa: E402
from mutor2d.lm.offline_tokenizers import char_tokenizer  # noqa: E402
from mutor2d.lm.prompts import eval_prompts  # noqa: E402
from mutor2d.lm.records import load_located  # noqa: E402
from mutor2d.lm.rows import Rows  # noqa: E402
from mutor2d.lm.speculative import HFStep, TextEnds, generate_ids  # noqa: E402
from mutor2d.objectives.spec import RegisterSpec1D  # noqa: E402
from mutor2d.sampling import verification  # noqa: E402
from mutor2d.sampling.drafters import RegisterDrafter  # noqa: E402
from mutor2d.sampling.rules import SamplingRules, draw  # noqa: E402
from mutor2d.sampling.stats import DecodeStats  # noqa: E402

WIDTH = 32
CHARS = "abcdef"                       # 10 ids: small enough that drafts are kept, varied outputs


def tiny(family: str, vocab: int, init: float = 0.3):
    """A tiny random model of ``family`` (weights std ``init``: clear argmaxes)."""
    torch.manual_seed(0)
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=WIDTH, n_layer=2, n_head=4, n_positions=128,
                                          bos_token_id=1, eos_token_id=2, initializer_range=init)).eval()
    cls, cfg = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config)}[family]
    return cls(cfg(vocab_size=vocab, hidden_size=WIDTH, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
                   bos_token_id=1, eos_token_id=2, initializer_range=init)).eval()


def with_lora(lm, merged: bool):
    """LoRA adapters with random (non-zero) weights, merged into the base or left as a PeftModel."""
    targets = ["c_attn"] if isinstance(lm, GPT2LMHeadModel) else ["q_proj", "v_proj"]
    model = hf.apply_lora(lm, r=4, alpha=8, dropout=0.0, targets=targets)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.3)
    return (model.merge_and_unload() if merged else model).eval()


def registers(K: int = 3, seed: int = 2, scale: float = 1.0) -> Registers:
    """An untrained register embedding drafting d = 2..K+1 (exactness needs no training)."""
    return Registers(torch.randn(WIDTH, generator=torch.Generator().manual_seed(seed)) * scale, RegisterSpec1D(1, K + 1),
                     K)


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    P = max(map(len, prompts))
    ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    return ids, (torch.arange(P)[None] >= torch.tensor([P - len(p) for p in prompts])[:, None]).long()


PROMPTS = {1: ["abca"], 3: ["abca", "b", "cabbac"]}


def cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) (b, heads, L, head_dim) of every layer of a DynamicCache."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


@pytest.mark.parametrize("lora", ["none", "merged", "unmerged"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_greedy_is_plain_generate_token_for_token(family, batch, lora):
    tok = char_tokenizer(CHARS)
    lm = tiny(family, len(tok))
    lm = lm if lora == "none" else with_lora(lm, lora == "merged")
    prompts = [tok(t)["input_ids"] for t in PROMPTS[batch]]
    plain = hf.generate(lm, tok, prompts, 24)
    assert hf.generate(lm, tok, prompts, 24, decode="registers", registers=registers()) == plain
    ids, mask = left_padded(prompts)
    ref = lm.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24, eos_token_id=None,
                      pad_token_id=0)[:, ids.shape[1]:].tolist()
    stats = DecodeStats()
    assert generate_ids(lm, ids, mask, 24, registers=registers(K=2, seed=5), stats=stats) == ref   # no EOS
    summary = stats.summary()
    assert summary["forwards_per_token"] < 1.0 and sum(summary["accepted"]) > 0      # some drafts were kept


@pytest.mark.parametrize("family", ["gemma2", "mistral"])
def test_greedy_with_a_sliding_window_is_plain_generate(family):
    """Gemma 2 (soft-capping, per-layer-type masks) and Mistral, window 3: the window comes from position
    ids in the mask, so holes in the cache do not move it."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM
    cls, cfg = {"gemma2": (Gemma2ForCausalLM, Gemma2Config), "mistral": (MistralForCausalLM, MistralConfig)}[family]
    tok = char_tokenizer(CHARS)
    torch.manual_seed(0)
    lm = cls(cfg(vocab_size=len(tok), hidden_size=WIDTH, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=3,
                 max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                 initializer_range=0.3)).eval()
    ids, mask = left_padded([tok(t)["input_ids"] for t in PROMPTS[3]])
    ref = lm.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24, eos_token_id=None,
                      pad_token_id=0)[:, ids.shape[1]:].tolist()
    assert generate_ids(lm, ids, mask, 24, registers=registers(K=2, seed=5)) == ref


def test_stop_strings_and_eos_end_as_in_plain_generate():
    """Stop strings end rows where transformers' criteria end plain generate (a stop string in a special
    token's text, "a" in <pad>; one across the prompt's end, "af"), or, on a vocabulary they cannot
    map, where the cut text ends; EOS ends rows as in plain generate."""
    tok = char_tokenizer(CHARS)
    lm = tiny("llama", len(tok))
    prompts = [tok(t)["input_ids"] for t in PROMPTS[3]]
    plain = hf.generate(lm, tok, prompts, 30)
    for stop in (["a"], ["bc", "ca"], ["af", "fb"], ["ff"]):
        cut = hf.generate(lm, tok, prompts, 30, stop)
        assert hf.generate(lm, tok, prompts, 30, stop, decode="registers", registers=registers()) == cut, stop
    narrow = char_tokenizer("0123456789+=\n")                 # no letters: transformers' criteria refuse it
    digits = tiny("gpt2", len(narrow))
    ids = [narrow("1+2=")["input_ids"], narrow("3=")["input_ids"]]
    assert not hf.maps_stop_strings(narrow, ["3"]) and hf.maps_stop_strings(tok, ["a"])
    for stop in (["9"], ["\nQuestion:", "4"]):
        cut = hf.generate(digits, narrow, ids, 12, stop)
        assert cut != hf.generate(digits, narrow, ids, 12)
        assert hf.generate(digits, narrow, ids, 12, stop, decode="registers", registers=registers()) == cut, stop
    lm.generation_config.eos_token_id = 4                    # 'a' ends a sequence: outputs stop at it
    ended = hf.generate(lm, tok, prompts, 30)
    assert hf.generate(lm, tok, prompts, 30, decode="registers", registers=registers()) == ended
    assert ended != plain


def test_kv_cache_after_every_round_is_plain_decodings():
    """After each round a row's cached slots (holes left by drafts another row kept excluded) hold the
    keys and values plain decoding computes for the same tokens; batch 1 has no holes at all (six
    rounds, watched through the loop's progress callback; no row ends in them, so rows keep their order)."""
    from mutor2d.sampling.rounds import decode

    class Enough(Exception):
        pass

    tok = char_tokenizer(CHARS)
    lm = tiny("llama", len(tok))
    for texts in (PROMPTS[1], PROMPTS[3]):
        prompts = [tok(t)["input_ids"] for t in texts]
        ids, mask = left_padded(prompts)
        state, regs, emitted = Rows(len(prompts), 40, (), (), None), registers(seed=5), []
        step = HFStep(lm, ids, mask, regs.embedding)

        def check(out, n):
            cached = cache_tensors(step.cache)
            for b in range(len(prompts)):
                tokens = prompts[b] + state.out[b][:-1]              # the last emitted token is not cached yet
                ok = step.ok[b]
                assert int(ok.sum()) == len(tokens)
                if len(texts) == 1:
                    assert bool(ok.all())                             # batch 1: cropped to exactly the tokens
                with torch.no_grad():
                    ref = lm(input_ids=torch.tensor([tokens]), use_cache=True).past_key_values
                for (k, v), (rk, rv) in zip(cached, cache_tensors(ref)):
                    torch.testing.assert_close(k[b][:, ok], rk[0], atol=1e-5, rtol=1e-5)
                    torch.testing.assert_close(v[b][:, ok], rv[0], atol=1e-5, rtol=1e-5)
            assert len(cached[0][0][0, 0]) == step.ok.shape[1]       # registers never stay
            emitted.append(n.clone())
            if len(emitted) == 6:
                raise Enough

        with pytest.raises(Enough):
            drafter = RegisterDrafter(make("sample.decode", name="registers", draft=regs.draft), regs.spec, (1, 40),
                                      len(prompts), "cpu")
            decode(step, drafter, step.frame(40, regs.draft),
                   SamplingRules(temperature=0.0), ends=TextEnds(state, regs.draft), progress=check)
        steps = torch.diff(torch.stack([torch.ones_like(emitted[0]), *emitted]), dim=0)
        assert int(steps.max()) > 1                                   # some drafts were kept


def test_synced_rows_stay_in_the_batch_and_give_the_same_tokens():
    """``synced`` (FSDP2): done rows keep stepping, ignored, until every process is done (one process
    here); the outputs are those of the unsynced decoder."""
    import socket
    import torch.distributed as dist
    tok = char_tokenizer(CHARS)
    lm = tiny("llama", len(tok))
    lm.generation_config.eos_token_id = 4                    # 'a' ends a sequence: rows end at different times
    prompts = [tok(t)["input_ids"] for t in PROMPTS[3]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        synced = hf.generate(lm, tok, prompts, 20, decode="registers", registers=registers(), synced=True)
    finally:
        dist.destroy_process_group()
    assert synced == hf.generate(lm, tok, prompts, 20, decode="registers", registers=registers())
    assert len({len(t) for t in synced}) > 1


# ----------------------------------------------------------------------------- sampling, exactly

MAX_NEW = 3


def sequence_probs(lm, prompt: list[int], rules: SamplingRules, eos: int) -> dict[tuple, float]:
    """Every continuation of ``prompt`` (up to EOS or MAX_NEW tokens) with its probability under plain
    sampling with ``rules``, by enumeration."""
    out, todo = {}, [((), 1.0)]
    while todo:
        seq, p = todo.pop()
        if len(seq) == MAX_NEW or (seq and seq[-1] == eos):
            out[seq] = p
            continue
        with torch.no_grad():
            probs = rules.probs(lm(input_ids=torch.tensor([prompt + list(seq)])).logits[0, -1])
        todo += [(seq + (t,), p * float(q)) for t, q in enumerate(probs.tolist()) if q > 0]
    return out


def chi_square_p(counts: dict[tuple, int], probs: dict[tuple, float]) -> float:
    """p-value of the counts under ``probs`` (cells with an expected count < 5 pooled)."""
    from scipy.stats import chi2
    n = sum(counts.values())
    cells, rest_obs, rest_exp = [], 0, 0.0
    for seq, p in probs.items():
        if n * p >= 5:
            cells.append((counts.get(seq, 0), n * p))
        else:
            rest_obs, rest_exp = rest_obs + counts.get(seq, 0), rest_exp + n * p
    if rest_exp > 0:
        cells.append((rest_obs, rest_exp))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    assert sum(counts.values()) == n and all(seq in probs for seq in counts)   # nothing impossible drawn
    return float(chi2.sf(stat, len(cells) - 1))


def draw_sequences(lm, prompt, rules, n: int, seed: int) -> dict[tuple, int]:
    ids = torch.tensor([prompt] * n)
    outs = generate_ids(lm, ids, torch.ones_like(ids), MAX_NEW, registers=registers(K=2, scale=3.0), rules=rules,
                        eos=[2], generator=torch.Generator().manual_seed(seed))
    counts: dict[tuple, int] = {}
    for o in outs:
        counts[tuple(o)] = counts.get(tuple(o), 0) + 1
    return counts


def residual_from_p(p, drafts, generator):
    """A wrong rule (the control): the acceptance test as it should be, but after a rejection the token
    is drawn from p instead of normalise(max(p - q, 0))."""
    B, K1, V = p.shape
    d = drafts.tokens[..., None]
    p_d, q_d = p[:, :K1 - 1].gather(-1, d)[..., 0], drafts.probs.gather(-1, d)[..., 0]
    lead = (drafts.valid & (torch.rand(B, K1 - 1, generator=generator) * q_d < p_d)).long().cumprod(1).bool()
    kept = lead.sum(1)
    return kept, draw(p.gather(1, kept[:, None, None].expand(B, 1, V))[:, 0], generator), lead


@pytest.mark.parametrize("rules", [SamplingRules(temperature=1.0), SamplingRules(temperature=0.8, top_k=4, top_p=0.9)],
                         ids=["t1", "topk-topp"])
def test_sampling_follows_plain_sampling_distribution(rules, monkeypatch):
    tok = char_tokenizer("ab")                                # 6 ids: <pad> <bos> <eos> <unk> a b
    lm = tiny("llama", len(tok), init=0.15)
    prompt = tok("ab")["input_ids"]
    probs = sequence_probs(lm, prompt, rules, eos=2)
    assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-5) and len(probs) > 10
    assert chi_square_p(draw_sequences(lm, prompt, rules, 6000, seed=0), probs) > 1e-3
    monkeypatch.setattr(verification, "verify", residual_from_p)
    assert chi_square_p(draw_sequences(lm, prompt, rules, 6000, seed=0), probs) < 1e-6


# ----------------------------------------------------------------------------- drafters and the evaluator

def test_draft_length_comes_from_the_objective_and_bad_settings_are_one_line(tmp_path):
    from mutor2d.config import make
    mutor = make("objective", name="mutor-1d", d_max=4)
    embedding = torch.zeros(WIDTH)
    assert drafter.registers_of(embedding, mutor).offsets == (2, 3, 4)
    assert drafter.registers_of(embedding, mutor, 2).offsets == (2, 3)
    with pytest.raises(ConfigError, match="draft=4: this checkpoint's registers draft at most 3 tokens"):
        drafter.registers_of(embedding, mutor, 4)
    with pytest.raises(ConfigError, match="no registers to draft with \\(objective ntp\\)"):
        drafter.registers_of(embedding, make("objective", name="ntp"))
    with pytest.raises(ValueError, match="no register_embedding.safetensors .*decode plain"):
        drafter.load_registers(tmp_path)
    with pytest.raises(ValueError, match="decode='fast': expected one of plain, registers, auto"):
        hf.generate(tiny("llama", 8), char_tokenizer("ab"), [[1, 4]], 2, decode="fast")
    assert drafter.folder_mode("auto", tmp_path) == "plain"


def _script():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "eval" / "lm_accuracy.py"
    spec = importlib.util.spec_from_file_location("lm_accuracy_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_eval_decode_registers_writes_plain_outputs_and_names_its_statistics(tmp_path, monkeypatch):
    from test_lm_accuracy import SUMS, _cfg, _write_lines, format_lines, tiny_lm, tiny_tokenizer
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = tiny_tokenizer()
    base = tmp_path / "base"
    tiny_lm(tok).save_pretrained(base)
    tok.save_pretrained(base)
    path = _write_lines(tmp_path / "sums.jsonl", format_lines("prompt-answer"))
    run = lm_pkg.train({**_cfg(base, path, "full"), "objective": {"name": "mutor-1d", "d_max": 3}}, tmp_path / "run")
    script, args = _script(), ["--ckpt", str(run), "--data", str(path), "--max-new-tokens", "12", "--batch-size", "5"]
    outputs, records = {}, {}
    for mode in ("plain", "registers", "auto"):
        result = script.main(args + ["--decode", mode, "--out", str(tmp_path / f"{mode}.jsonl")])
        outputs[mode] = [json.loads(line)["output"] for line in open(result["predictions"])]
        records[mode] = json.loads(open(result["record"]).read())["sampling"]
    assert len(outputs["plain"]) == len(SUMS) and outputs["registers"] == outputs["plain"] == outputs["auto"]
    assert records["plain"]["decode"] == "plain" and records["plain"]["decode_stats"]["forwards_per_token"] == 1.0
    reg = records["registers"]
    assert reg["decode"] == "registers" and reg["decode_options"] == {"draft": 2, "offsets": [2, 3]}
    stats = reg["decode_stats"]
    assert 0 < stats["forwards_per_token"] <= 1.0 and len(stats["acceptance_by_distance"]) == 2
    assert records["auto"]["decode"] == "registers"
    ntp = lm_pkg.train({**_cfg(base, path, "full"), "objective": {"name": "ntp"}}, tmp_path / "ntp")
    assert script.main(["--ckpt", str(ntp), "--data", str(path), "--max-new-tokens", "2", "--decode", "auto",
                        "--out", str(tmp_path / "ntp.jsonl")])["n"] == len(SUMS)
    with pytest.raises(ValueError, match="no register_embedding.safetensors"):
        script.main(["--ckpt", str(ntp), "--data", str(path), "--max-new-tokens", "2", "--decode", "registers"])


def test_online_evaluation_decodes_with_the_runs_setting(tmp_path):
    from test_lm import _eval_cfg
    cfg = _eval_cfg(tmp_path)
    cfg["eval"]["decode"] = "registers"
    out = lm_pkg.train(cfg, tmp_path / "run")
    recs = [json.loads(p.read_text()) for p in (out / "eval").glob("*.json")]
    assert len(recs) == 2 and all(r["sampling"]["decode"] == "registers" for r in recs)
    assert all(0 < r["sampling"]["decode_stats"]["forwards_per_token"] <= 1 for r in recs)
    tok = hf.load_tokenizer(out / "step_2")
    items = eval_prompts(load_located("jsonl", cfg["eval"]["path"])[:5], tok)
    texts = hf.generate(hf.load_for_inference(out / "step_2"), tok, [it["prompt_ids"] for it in items], 4)
    lines = (out / "eval" / "predictions_lm_tiny_step2.jsonl").read_text().splitlines()
    online = [json.loads(line)["output"] for line in lines]
    assert online == texts
    cfg["objective"] = {"name": "ntp"}
    with pytest.raises(ConfigError, match="no registers to draft with"):
        lm_pkg.train(cfg, tmp_path / "ntp")
    cfg["eval"]["decode"] = "auto"                            # no registers: plain
    out = lm_pkg.train(cfg, tmp_path / "ntp_auto")
    assert {json.loads(p.read_text())["sampling"]["decode"] for p in (out / "eval").glob("*.json")} == {"plain"}


def test_bench_quick_json(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "bench/lm_decode.py", "--quick", "--work", str(tmp_path)], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "lm_decode" and out["d_max"] == 4 and out["targets"]["greedy_exact"]
    cases = out["cases"]
    assert {"plain/greedy/b1", "prompt_lookup/greedy/b1", "registers_K3/t1/b8"} <= set(cases)
    assert cases["plain/greedy/b1"]["forwards_per_token"] == 1.0
    assert all(len(cases[f"registers_K{K}/greedy/b1"]["acceptance_by_distance"]) == K for K in (1, 2, 3))
    assert out["decode_step"]["step_vs_floor"] > 0


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_register_decoding_stays_exact_under_bidirectional_prompts(family):
    """prompt_attention bidirectional: register decoding's prefill opens the prompt as plain generation's
    does (hf.prefill_prompts), so greedy tokens are plain bidirectional generate's, which differ from
    causal ones on this model."""
    tok = char_tokenizer(CHARS)
    lm = tiny(family, len(tok))
    prompts = [tok(t)["input_ids"] for t in PROMPTS[3]]
    plain = hf.generate(lm, tok, prompts, 24, prompt_attention="bidirectional")
    drafted = hf.generate(lm, tok, prompts, 24, prompt_attention="bidirectional", decode="registers",
                          registers=registers())
    assert drafted == plain and plain != hf.generate(lm, tok, prompts, 24)
    ids, mask = left_padded(prompts)                   # a model load_for_inference marked: its own rule
    marked = generate_ids(hf.with_prompt_attention(lm, "bidirectional"), ids, mask, 24, registers=registers())
    assert marked == generate_ids(lm, ids, mask, 24, registers=registers(), prompt_attention="bidirectional")
    assert marked != generate_ids(lm, ids, mask, 24, registers=registers(), prompt_attention="causal")
