"""Register attention alone, forward + backward, side by side: which way of computing the registers'
attention is cheapest, measured against next-token's causal attention of the same body.

Rule (mutor2d.model.extras): T regular tokens attend causally and never see a register; register e sees
the regular keys up to its anchor and itself. Cases (q, k, v: (B, heads, T + E, head_dim)):
  ntp      causal SDPA over the T regular tokens (the body alone)
  split    the model's path: causal SDPA over the body, then one SDPA of the E register queries over
           all T + E keys with a (B, 1, E, T + E) boolean mask
  lse      the registers over the T body keys written out, their own key merged by log-sum-exp
Dense: E = T; sparse: E = --sparse. split and lse are checked against each other (max |diff|).

    python bench/register_attention.py --threads 1 --clock cpu
"""
from __future__ import annotations

import argparse

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

import common             # the command line parses before torch is imported
from mutor2d.cli import HelpFormatter


def lse_attend(q, k, v, T: int, body_mask):
    """The ``lse`` case: causal body, then registers over body keys merged with their own key."""
    import torch
    import torch.nn.functional as F
    main = F.scaled_dot_product_attention(q[:, :, :T], k[:, :, :T], v[:, :, :T], is_causal=True)
    qe, ke, ve = q[:, :, T:], k[:, :, T:], v[:, :, T:]
    scale = q.shape[-1] ** -0.5
    s = (qe @ k[:, :, :T].transpose(-1, -2) * scale).masked_fill(~body_mask, float("-inf"))
    own = (qe * ke).sum(-1, keepdim=True) * scale
    top = torch.maximum(s.amax(-1, keepdim=True), own).detach()
    p, p_own = (s - top).exp(), (own - top).exp()
    return torch.cat([main, (p @ v[:, :, :T] + p_own * ve) / (p.sum(-1, keepdim=True) + p_own)], 2)


def split_attend(q, k, v, T: int, full_mask):
    import torch
    import torch.nn.functional as F
    main = F.scaled_dot_product_attention(q[:, :, :T], k[:, :, :T], v[:, :, :T], is_causal=True)
    return torch.cat([main, F.scaled_dot_product_attention(q[:, :, T:], k, v, attn_mask=full_mask)], 2)


def cases_for(E: int, args, device):
    """The three cases of E registers, and max |diff| of split against lse (outputs and gradients)."""
    import torch
    import torch.nn.functional as F
    B, H, hd, T = args.batch, args.heads, args.dim // args.heads, args.tokens
    g = torch.Generator().manual_seed(E)
    anchor = torch.randint(0, T, (B, E), generator=g)
    body = (torch.arange(T)[None, None] <= anchor[..., None])[:, None].to(device)            # (B, 1, E, T)
    full = torch.cat([body, torch.eye(E, dtype=torch.bool, device=device).expand(B, 1, E, E)], -1)
    q, k, v = (torch.randn(B, H, T + E, hd, generator=g).to(device).requires_grad_() for _ in range(3))
    outs = [f(q, k, v, T, m) for f, m in ((split_attend, full), (lse_attend, body))]
    grads = [torch.autograd.grad(o, (q, k, v), torch.ones_like(o)) for o in outs]
    diff = max([(outs[0] - outs[1]).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(*grads)])

    def run(fn):
        def step():
            fn().backward(torch.ones(B, H, T + (0 if fn is ntp else E), hd, device=device))
        return step

    def ntp():
        return F.scaled_dot_product_attention(q[:, :, :T], k[:, :, :T], v[:, :, :T], is_causal=True)
    return {"ntp": run(ntp), "split": run(lambda: split_attend(q, k, v, T, full)),
            "lse": run(lambda: lse_attend(q, k, v, T, body))}, diff


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--dim", type=int, default=768, help="model width (GPT-B: 768)")
    ap.add_argument("--heads", type=int, default=12, help="attention heads")
    ap.add_argument("--tokens", type=int, default=256, help="regular tokens T (16 x 16 grid: 256)")
    ap.add_argument("--sparse", type=int, default=80, help="registers of the sparse case (the paper's 80)")
    common.add_timing_options(ap, 5)
    return ap


def main(argv=None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)
    common.check_at_least(ap, args, 1, "batch", "dim", "heads", "tokens", "sparse", "reps", "threads")
    common.check_reps(ap, args)
    if args.dim % args.heads:
        ap.error(f"--dim {args.dim}: expected a multiple of --heads {args.heads}")
    import torch
    device = common.open_device(args)
    result = {}
    for name, E in (("dense", args.tokens), ("sparse", args.sparse)):
        cases, diff = cases_for(E, args, device)
        times = common.time_round_robin(cases, args.reps, 1, device)
        result[name] = {"registers": E, "time_s": times, "max_abs_diff_split_vs_lse": f"{diff:.1e}",
                        "split_vs_ntp": times["split"] / times["ntp"], "lse_vs_ntp": times["lse"] / times["ntp"],
                        "lse_vs_split": times["lse"] / times["split"]}
    common.emit({"bench": "register_attention", "machine": common.machine(device),
                 "settings": {k: getattr(args, k) for k in ("batch", "dim", "heads", "tokens", "reps", "clock")}
                 | {"threads": torch.get_num_threads()}, "cases": result})


if __name__ == "__main__":
    main()
