"""Speculative decoding (register drafts, Jacobi): whole sequences follow plain sampling's exact
distribution (chi-square against the enumerated distribution of a tiny model), a wrong acceptance
rule is caught, greedy decoding reproduces plain greedy's tokens, the KV cache holds what a plain
run leaves, bad settings are one-line errors; register drafts take their offsets, edge rule and
length from the checkpoint's objective."""
import itertools

import pytest
import torch

from mutor2d.config import ConfigError, make
from mutor2d.model.config import ModelConfig
from mutor2d.model.gpt import GPT
from mutor2d.objectives.spec import RegisterSpec, RegisterSpec1D, RegisterSpec2D
from mutor2d.objectives.layout import regular_position_ids
from mutor2d.sampling.rules import SamplingRules as Rules
from mutor2d.sampling.decoding import GPTStep, generate, run_decoder
from mutor2d.sampling import verification
from mutor2d.sampling.drafters import Drafter, JacobiDrafter, RegisterDrafter
from mutor2d.sampling.rounds import Frame, decode
from mutor2d.sampling.verification import Drafts
from mutor2d.sampling.config import useful_draft
from mutor2d.sampling.stats import DecodeStats

SPEC_2D = RegisterSpec2D(d_max=4)                          # draft offsets (0, 2), (0, 3)


def spec_1d(K: int) -> RegisterSpec:
    """MuToR-1D registers d = 1..K+1 ahead: K draft offsets, and anchors at the last prefix token."""
    return RegisterSpec1D(d_min=1, d_max=K + 1)


OBJ_2D = make("objective", name="mutor-2d", d_max=5)                 # useful draft length 3
OBJ_1D = make("objective", name="mutor-1d", d_min=1, d_max=4)        # useful draft length 3

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def decode_registers(m, prefix, grid, rules, generator, stats=None, *, spec, **mode):
    return run_decoder(m, prefix, grid, rules, make("sample.decode", name="registers", **mode), spec, generator, stats)


def decode_jacobi(m, prefix, grid, rules, generator, stats=None, *, window):
    return run_decoder(m, prefix, grid, rules, make("sample.decode", name="jacobi", window=window), None, generator,
                       stats)


def register_drafter(spec, K, grid, **mode):
    return RegisterDrafter(make("sample.decode", name="registers", draft=K, **mode), spec, grid, 1, "cpu")


def decode_keeping_cache(m, prefix, grid, rules, drafter):
    """The rounds of ``drafter`` on the GPT's step, its KV cache kept after (run_decoder clears it)."""
    frame = Frame(grid, 1, regular_position_ids(grid, 1, grid[0] * grid[1] + 1 + drafter.K))
    with torch.no_grad():
        return decode(GPTStep(m.eval(), prefix, rules, frame, drafter.K), drafter, frame, rules)


def tiny(V, C=2, prefix="class", rope="2d", register=True, std=0.6, seed=0, small=False, prompt_attention="causal",
         layers=1):
    torch.manual_seed(seed)
    size = dict(preset="custom", n_layer=layers, n_head=2, dim=16) if small else dict(preset="tiny")
    cfg = ModelConfig(vocab_size=V, num_classes=C, conditioning=prefix, rope=rope, **size,
                      token_dropout=0, resid_dropout=0, ffn_dropout=0, class_dropout=0,
                      prompt_attention=prompt_attention)
    m = GPT(cfg, register_token=register).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, std)
    return m


@torch.no_grad()
def exact_distribution(m, prefix: torch.Tensor, grid, rules: Rules) -> dict:
    """Probability of every body under plain sampling's rules, by enumeration (full forwards).
    prefix: one label (0-d) or one prompt (P,)."""
    V, N = m.cfg.vocab_size, grid[0] * grid[1]
    bodies = torch.tensor(list(itertools.product(range(V), repeat=N)))
    prefix = prefix.expand(len(bodies), *prefix.shape)
    P = m.prefix_len(prefix)
    if rules.guided:
        prefix, bodies2 = torch.cat([prefix, torch.full_like(prefix, m.cfg.num_classes)]), torch.cat([bodies, bodies])
    else:
        bodies2 = bodies
    pos = regular_position_ids(grid, P).expand(len(prefix), -1, -1)
    p = rules.probs(rules.combine(m(bodies2[:, :-1], pos, prefix)))[:, P - 1:]   # (S, N, V)
    prob = p.gather(-1, bodies[..., None])[..., 0].prod(-1)
    return {tuple(b): float(q) for b, q in zip(bodies.tolist(), prob)}


def chi_square_p(samples: torch.Tensor, exact: dict) -> float:
    """p-value of the samples (S, N) under ``exact``; cells expecting < 5 draws are pooled."""
    S = samples.shape[0]
    counts = {}
    for row in map(tuple, samples.tolist()):
        counts[row] = counts.get(row, 0) + 1
    assert set(counts) <= {k for k, v in exact.items() if v > 0}, "a sequence of probability 0 was drawn"
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for key, prob in exact.items():
        if prob * S >= 5:
            obs.append(counts.get(key, 0)), exp.append(prob * S)
        else:
            pool_o, pool_e = pool_o + counts.get(key, 0), pool_e + prob * S
    if pool_e > 0:
        obs.append(pool_o), exp.append(pool_e)
    obs, exp = torch.tensor(obs, dtype=torch.float64), torch.tensor(exp, dtype=torch.float64)
    stat = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor(len(obs) - 1.0, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


EXACT_CASES = [  # id, decoder, option, grid, vocabulary, rules (register drafts need rows of 3+)
    ("registers-cfg", decode_registers, dict(draft=2, spec=SPEC_2D), (2, 3), 3, Rules(cfg_scale=2.0, guided=True)),
    ("registers-1d-topk-temp", decode_registers, dict(draft=3, spec=spec_1d(3)), (1, 4), 4,
     Rules(temperature=1.6, top_k=2)),
    ("registers-1d-topp", decode_registers, dict(draft=2, spec=spec_1d(2)), (1, 4), 3,
     Rules(temperature=0.8, top_p=0.8)),
    ("jacobi-cfg-topk-temp", decode_jacobi, dict(window=2), (2, 2), 4,
     Rules(cfg_scale=1.5, temperature=0.7, top_k=3, guided=True)),
    ("registers-prompt-temp", decode_registers, dict(draft=2, spec=spec_1d(2)), (1, 4), 3, Rules(temperature=1.3)),
    ("registers-prompt-bidirectional-temp", decode_registers, dict(draft=2, spec=spec_1d(2)), (1, 4), 3,
     Rules(temperature=1.3)),
    ("registers-last-cfg", decode_registers, dict(draft=2, anchors="last", spec=SPEC_2D), (2, 3), 3,
     Rules(cfg_scale=2.0, guided=True)),
    ("registers-nofill-temp", decode_registers, dict(draft=2, fill=False, spec=SPEC_2D), (2, 3), 3,
     Rules(temperature=1.2)),
    ("registers-raster-edge-temp", decode_registers, dict(draft=2, spec=RegisterSpec2D(d_max=4, edge="raster")),
     (2, 3), 3, Rules(temperature=1.1)),
]
S = 6000


def run_case(case, seed=0):
    name, decoder, option, grid, V, rules = case
    kind = "prompt" if "prompt" in name else "class"
    bidirectional = "bidirectional" in name               # 2 layers: a prompt token's output then matters
    m = tiny(V=V, prefix=kind, rope="1d" if grid[0] == 1 else "2d", small=True, layers=1 + bidirectional,
             prompt_attention="bidirectional" if bidirectional else "causal")
    prefix = torch.tensor([2, 0]) if kind == "prompt" else torch.tensor(1)
    stats = DecodeStats()
    with torch.no_grad():
        out = decoder(m, prefix.expand(S, *prefix.shape), grid, rules, torch.Generator().manual_seed(seed),
                      stats, **option)
    return out, exact_distribution(m, prefix, grid, rules), stats.summary()


@pytest.mark.parametrize("case", EXACT_CASES, ids=[c[0] for c in EXACT_CASES])
def test_speculative_samples_follow_the_plain_distribution(case):
    out, exact, stats = run_case(case)
    assert chi_square_p(out, exact) > 1e-3
    rate = stats["acceptance_by_distance"][0]
    assert 0.05 < rate < 0.98, stats             # both verification paths are exercised
    assert stats["forwards_per_sequence"] < case[3][0] * case[3][1]


def test_a_bidirectional_prompt_changes_the_distribution():
    """The bidirectional case above is not the causal one in disguise: the enumerated distributions differ."""
    dists = [exact_distribution(tiny(V=3, prefix="prompt", rope="1d", small=True, layers=2, prompt_attention=rule),
                                torch.tensor([2, 0]), (1, 4), Rules(temperature=1.3))
             for rule in ("causal", "bidirectional")]
    assert max(abs(dists[0][k] - dists[1][k]) for k in dists[0]) > 1e-3


def test_a_wrong_acceptance_rule_fails_the_exactness_test(monkeypatch):
    """Accepting every draft the target allows (q ignored) biases samples toward the drafter."""
    right = verification.verify
    monkeypatch.setattr(verification, "verify", lambda p, d, g: right(
        p, Drafts(d.tokens, torch.zeros_like(d.probs), d.valid), g))
    for case in EXACT_CASES[:2]:
        out, exact, _ = run_case(case)
        assert chi_square_p(out, exact) < 1e-6, case[0]


GREEDY_CASES = [  # id, model kwargs, prefix, grid, cfg_scale, objective
    ("class-2d", dict(), torch.tensor([0, 3, 7, 9, 1]), (4, 5), 1.0, OBJ_2D),
    ("class-2d-cfg", dict(), torch.tensor([2, 5, 8]), (4, 4), 2.0, OBJ_2D),
    ("prompt-1d", dict(prefix="prompt", rope="1d"), torch.tensor([[1, 2, 3], [4, 5, 6]]), (1, 12), 1.0, OBJ_1D),
]


@pytest.mark.parametrize("mode, option", [("registers", dict(draft=3)), ("jacobi", dict(window=3)),
                                          ("registers", dict(draft=3, anchors="last")),
                                          ("registers", dict(draft=2, fill=False))])
@pytest.mark.parametrize("case", GREEDY_CASES, ids=[c[0] for c in GREEDY_CASES])
def test_greedy_equals_plain_greedy(case, mode, option):
    _, kw, prefix, grid, cfg_scale, objective = case
    m = tiny(V=17, C=10, std=0.3, **kw)
    plain = generate(m, prefix, grid, temperature=0.0, cfg_scale=cfg_scale)
    counts = DecodeStats()
    fast = generate(m, prefix, grid, temperature=0.0, cfg_scale=cfg_scale, decode=mode, stats=counts,
                    objective=objective, **option)
    assert torch.equal(fast, plain)
    stats = counts.summary()
    assert stats["forwards"] >= 2 and stats["tokens_per_forward"] >= 1.0


@pytest.mark.parametrize("drafter", [register_drafter(SPEC_2D, 2, (4, 4)),
                                     JacobiDrafter(make("sample.decode", name="jacobi", window=2))],
                         ids=["registers", "jacobi"])
@torch.no_grad()
def test_kv_cache_after_speculative_equals_plain(drafter):
    m, labels, grid = tiny(V=17, C=10, std=0.3), torch.tensor([1, 4, 6]), (4, 4)
    rules = Rules(temperature=0.0)
    plain = decode_keeping_cache(m, labels, grid, rules, Drafter())
    ref = [tuple(t.clone() for t in layer.attention.cache) for layer in m.layers]
    fast = decode_keeping_cache(m, labels, grid, rules, drafter)
    assert torch.equal(fast, plain)
    T = 1 + 16 - 1                                   # prefix + x_0..x_{N-2}
    for layer, (k, v) in zip(m.layers, ref):
        kc, vc = layer.attention.cache
        torch.testing.assert_close(kc[:, :, :T], k[:, :, :T], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(vc[:, :, :T], v[:, :, :T], rtol=1e-5, atol=1e-5)
    m.clear_cache()


@pytest.mark.parametrize("kw, msg", [
    (dict(decode="registers", draft=0), "^sample.decode.draft: expected an integer >= 1 .*, got 0$"),
    (dict(decode="jacobi", window=-1), "^sample.decode.window: expected an integer >= 1, got -1$"),
    (dict(decode="jacobi", window=True), "^sample.decode.window: expected an integer, got True$"),
    (dict(decode="jacobi", window=4), r"^sample.decode.window=4: a 2x2 grid has 4 tokens, so a window guesses at most 3"),
    (dict(decode="bogus"), r"^sample.decode.name: expected one of \['plain', 'registers', 'jacobi', 'auto'\], got 'bogus'$"),
    (dict(decode="registers", anchors="first"), r"^sample.decode.anchors: expected one of \['every', 'last'\]"),
    (dict(decode="registers", draft=3), r"^sample.decode.draft=3: this checkpoint's registers draft at most 2 tokens "
                                        r"\(objective mutor-2d, d_max=4\)$"),
    (dict(decode="registers", objective=None), r"^sample.decode.name=registers: this checkpoint has no registers"),
    (dict(decode="plain", draft=2), r"^unknown config key 'sample.decode.draft' for sample.decode.name=plain"),
])
def test_bad_settings_are_one_line_errors(kw, msg):
    kw = {"objective": make("objective", name="mutor-2d", d_max=4), **kw}
    with pytest.raises(ConfigError, match=msg) as e:
        generate(tiny(V=5), torch.tensor([1]), (2, 2), **kw)
    assert "\n" not in str(e.value)


def test_useful_draft_length_comes_from_the_objective():
    """D - 2 for MuToR-2D, d_max - 1 for MuToR-1D with d_min <= 2; none without registers."""
    assert useful_draft(make("objective", name="mutor-2d", d_max=4), None) == 2
    assert useful_draft(make("objective", name="mutor-2d", d_max=6), 3) == 3
    assert useful_draft(make("objective", name="mutor-1d", d_min=2, d_max=5), None) == 4
    with pytest.raises(ConfigError, match=r"^--draft 5: this checkpoint's registers draft at most 2 tokens "
                                          r"\(objective mutor-2d, d_max=4\)$"):
        useful_draft(make("objective", name="mutor-2d", d_max=4), 5, "--draft")
    with pytest.raises(ConfigError, match=r"never learned offset \(0, 2\).*d_min=3, d_max=5"):
        useful_draft(make("objective", name="mutor-1d", d_min=3, d_max=5), None)
    for name in ("ntp", "multihead"):
        with pytest.raises(ConfigError, match=rf"^--decode registers: .*no registers .*\(objective {name}\)"):
            useful_draft(make("objective", name=name), None, "--draft", "--decode")


def test_register_drafts_need_a_register_embedding():
    with pytest.raises(ValueError, match="no register embedding") as e:
        generate(tiny(V=5, register=False), torch.tensor([1]), (2, 2), decode="registers", draft=2,
                 objective=make("objective", name="mutor-2d", d_max=4))
    assert "\n" not in str(e.value)
    # Jacobi works for any checkpoint
    assert generate(tiny(V=5, register=False), torch.tensor([1]), (2, 2), decode="jacobi", window=3).shape == (1, 4)


def test_fill_uses_jacobi_guesses_where_registers_leave_the_row():
    """On a 2D grid, register drafts never cross a row edge; with fill (the default) Jacobi
    guesses take those slots, so fewer forwards are needed; without it, every kept draft is a
    register draft."""
    m, labels, grid = tiny(V=17, C=10, std=0.3), torch.tensor([1, 4, 6]), (4, 4)
    filled, bare = DecodeStats(), DecodeStats()
    generate(m, labels, grid, temperature=0.0, decode="registers", draft=3, stats=filled, objective=OBJ_2D)
    generate(m, labels, grid, temperature=0.0, decode="registers", draft=3, fill=False, stats=bare, objective=OBJ_2D)
    filled, bare = filled.summary(), bare.summary()
    assert filled["forwards_per_sequence"] < bare["forwards_per_sequence"]
    assert bare["register_proposed"] == bare["proposed"]
    assert sum(filled["register_proposed"]) < sum(filled["proposed"])


def test_same_start_rows_take_the_single_start_path():
    from mutor2d.sampling.decoding import shared_start
    assert shared_start(torch.tensor([3, 3]), lambda t: torch.cat([t, t])) == 3
    assert shared_start(torch.tensor([3, 4]), lambda t: torch.cat([t, t])).tolist() == [3, 4, 3, 4]


def test_register_drafts_follow_the_training_rules():
    """Anchor t, offset (0, d): target x_{t+d} if it stays in the row; position id of regular
    input P-1+target; the register reads regular inputs 0..P+t."""
    grid, P, K = (3, 4), 2, 2
    table = regular_position_ids(grid, P, P + 12 + K)
    drafter = register_drafter(SPEC_2D, K, grid)
    cur = torch.tensor([1, 5])                      # rows with 1 and 5 tokens emitted
    start = P + cur - 1                             # the regular index of the round's first input
    extras = drafter.extras(Frame(grid, P, table), cur)
    positions, limit = extras.positions, start[:, None] + extras.reads
    assert positions.shape == (2, (K + 1) * K, 2) and limit.shape == (2, (K + 1) * K)
    for b in range(2):
        for j in range(K + 1):                      # regular input j of the round: anchor t
            t = int(cur[b]) - 1 + j
            for i, d in enumerate(range(2, K + 2)):
                e = j * K + i
                assert int(limit[b, e]) == P + t
                valid = (t % 4) + d < 4
                assert bool(extras.valid[b, j, i]) == valid
                if valid:
                    assert positions[b, e].tolist() == table[P - 1 + t + d].tolist()


def test_register_drafts_follow_the_objectives_edge_rule_and_anchors():
    """A raster-edge objective drafts across row ends (its registers trained so); 1D offsets also
    anchor at the last prefix token, 2D offsets do not; K beyond the spec's draft offsets is refused."""
    grid, P, K = (3, 4), 1, 2
    frame = Frame(grid, P, regular_position_ids(grid, P, P + 12 + K))
    cur = torch.tensor([3])                                        # anchors t = 2, 3, 4: row ends at t = 3
    valid = {}
    for edge in ("geometric", "raster"):
        drafter = register_drafter(RegisterSpec2D(d_max=4, edge=edge), K, grid)
        valid[edge] = drafter.extras(frame, cur).valid[0].tolist()
    assert valid["geometric"] == [[False, False], [False, False], [True, True]]
    assert valid["raster"] == [[True, True], [True, True], [True, True]]
    line = Frame((1, 8), P, regular_position_ids((1, 8), P, P + 8 + K))
    assert register_drafter(spec_1d(K), K, (1, 8)).prefix_extras(line, 1) is not None
    assert register_drafter(SPEC_2D, K, grid).prefix_extras(frame, 1) is None
    with pytest.raises(ValueError, match="draft at most 2"):
        register_drafter(SPEC_2D, 3, grid)
