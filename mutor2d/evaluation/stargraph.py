"""Scoring a model on the path-star graph task (mutor2d.data.stargraph): greedy solve rates and
teacher-forced accuracy per answer position, of the next-token head and of registers per offset."""
from __future__ import annotations

import torch

from ..data.stargraph import StarGraphs
from ..objectives.spec import RegisterSpec, RegisterSpec1D
from ..objectives.layout import make_layout
from ..sampling.decoding import generate


@torch.no_grad()
def solve_rates(model, dataset: StarGraphs, batch_size: int = 256, device="cpu") -> dict:
    """Greedy decoding of every test graph: exact-path solve rate and first-step accuracy
    (the node after the source, the one the shortcut can only guess)."""
    solved = first = 0
    for s in range(0, len(dataset), batch_size):
        prompts = dataset.prompts[s:s + batch_size].to(device)
        answers = dataset.answers[s:s + batch_size].to(device)
        out = generate(model, prompts, dataset.grid, temperature=0.0)
        solved += int((out == answers).all(1).sum())
        k = dataset.first_step_index
        first += int((out[:, k] == answers[:, k]).sum())
    n = len(dataset)
    return {"solve_rate": solved / n, "first_step_acc": first / n, "n": n}


@torch.no_grad()
def teacher_forced_accuracy(model, dataset: StarGraphs, offsets: list[int], batch_size: int = 256,
                            device="cpu") -> dict:
    """Teacher-forced accuracy per answer position: of the next-token head, and (for models with a
    register token) of registers at each offset d, by target position. This is the diagnostic
    that moves first when registers start to plan. Returns {"ntp": [acc per position],
    "reg": {d: [acc per target position, None where no register targets it]}}."""
    N, P = dataset.shape.path_len, dataset.shape.prompt_len
    ntp_hits, n = torch.zeros(N), 0
    reg_hits = {d: torch.zeros(N) for d in offsets}
    reg_count = {d: torch.zeros(N) for d in offsets}
    for s in range(0, len(dataset), batch_size):
        body = dataset.answers[s:s + batch_size].to(device)
        prompt = dataset.prompts[s:s + batch_size].to(device)
        B = body.shape[0]
        for d in offsets if model.has_register_token else [None]:
            spec = RegisterSpec1D(d_min=d, d_max=d) if d is not None else RegisterSpec()
            lay = make_layout(B, dataset.grid, P, spec, device=device)
            T, R = lay.num_regular, lay.num_registers
            logits = model(body[:, : N - 1], lay.position_ids, prompt, R, lay.visibility)
            pred = logits.argmax(-1)
            ntp_t, reg_t = lay.gather_targets(body)
            if d is None or d == offsets[0]:
                ntp_hits += (pred[:, P - 1:T] == ntp_t[:, P - 1:]).float().sum(0).cpu()
                n += B
            if d is not None:
                ok = ((pred[:, T:] == reg_t) & lay.reg_valid).float()
                reg_hits[d].index_add_(0, lay.reg_target[0].cpu(), ok.sum(0).cpu())
                reg_count[d].index_add_(0, lay.reg_target[0].cpu(), lay.reg_valid.float().sum(0).cpu())
    reg = {d: [None if c == 0 else round(float(h / c), 4) for h, c in zip(reg_hits[d], reg_count[d])]
           for d in offsets} if model.has_register_token else {}
    return {"ntp": (ntp_hits / max(n, 1)).tolist(), "reg": reg}
