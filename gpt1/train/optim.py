"""Optimisation: parameter groups, the exact OAI Adam, torch AdamW, and pure learning-rate schedules.

OAI Adam (reference a.8, `opt.py`): with t the update number (1-based),

    lrt = lr * schedule(progress) * sqrt(1 - b2^t) / (1 - b1^t)
    p  <- p - lrt * (m / (sqrt(v) + eps) + l2 * p)         (l2 only on tensors of rank > 1)

i.e. the bias correction is folded into the step size and the L2 term is scaled by it too. The
trainer writes `lr * schedule(progress)` into each group's "lr"; the optimizer adds the bias
correction. Schedules are pure functions of the step so resume needs no scheduler state.

Step convention: OAI evaluates the schedule at the counter *before* it is incremented, so its very
first update has lr 0 (warm-up starts at 0). `TrainConfig.oai_first_step=True` (default) keeps
that; False evaluates at step + 1, as PyTorch ports do.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from gpt1.config import TrainConfig
from gpt1.errors import ConfigError


# ------------------------------------------------------------------------------- schedules
def warmup_steps(warmup: float, total: int) -> float:
    """Warm-up length in steps: `warmup` >= 1 is a step count, < 1 a fraction of `total`."""
    return float(warmup) if warmup >= 1 else float(warmup) * total


def lr_multiplier(step: int, total: int, warmup: float, kind: str) -> float:
    """The schedule factor at `step` (0-based) of `total`; OAI's functions of progress x = step/total.

    warmup_cosine: x/w during warm-up, then 0.5 (1 + cos(pi x)) (OAI: not renormalised after warm-up)
    warmup_linear: x/w during warm-up, then 1 - x   (OAI's (x/w if x <= w else 1) * (1 - x))
    warmup_constant: x/w during warm-up, then 1;  constant: 1.
    """
    if kind == "constant":
        return 1.0
    total = max(int(total), 1)
    x = step / total
    w = warmup_steps(warmup, total) / total
    if kind == "warmup_linear":
        # OAI multiplies the warm-up ramp by (1 - x) as well.
        return (x / w if (w > 0 and x <= w) else 1.0) * max(0.0, 1.0 - x)
    if w > 0 and x <= w:
        return x / w
    if kind == "warmup_cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(x, 1.0)))
    if kind == "warmup_constant":
        return 1.0
    raise ConfigError(f"unknown schedule {kind!r}")


def lr_at(step: int, cfg: TrainConfig, total: int) -> float:
    """The learning rate used for the update that follows `step` completed updates."""
    at = step if cfg.oai_first_step else step + 1
    return cfg.lr * lr_multiplier(at, total, cfg.warmup, cfg.schedule)


# ------------------------------------------------------------------------- parameter groups
def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices (rank > 1, incl. embeddings) decay; biases and LayerNorm gains do not."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() > 1 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class OAIAdam(torch.optim.Optimizer):
    """Adam exactly as OpenAI's GPT-1 code (reference a.8); see the module docstring.

    Gradient clipping is the trainer's job (global norm over all parameters, before this step).
    `fused` (default: where supported) runs torch's fused AdamW kernel with arguments chosen so
    that it computes OAI's update: one pass over each tensor instead of about eight.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 2.5e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fused: bool | None = None,
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.fused = fused

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            ms, vs, grads, steps = [], [], [], []
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                steps.append(state["step"])
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
                grads.append(p.grad)
            torch._foreach_add_(steps, 1.0)
            t = float(steps[0])
            use_fused = self.fused if self.fused is not None else _fused_ok(params, grads)
            (_fused_update if use_fused else _foreach_update)(
                params, grads, ms, vs, steps, t, group
            )
        return loss


def _fused_ok(params: list[torch.Tensor], grads: list[torch.Tensor]) -> bool:
    """Torch's fused Adam kernels: CPU and CUDA, one device, floating dtypes, dense grads."""
    device = params[0].device
    return (
        device.type in ("cpu", "cuda")
        and hasattr(torch, "_fused_adamw_")
        and all(
            p.device == device and p.is_floating_point() and not g.is_sparse and g.dtype == p.dtype
            for p, g in zip(params, grads)
        )
    )


def _foreach_update(
    params: list, grads: list, ms: list, vs: list, steps: list, t: float, group: dict
) -> None:
    """The OAI update written out with foreach ops (the reference the fused path must match)."""
    b1, b2 = group["betas"]
    lrt = group["lr"] * math.sqrt(1.0 - b2**t) / (1.0 - b1**t)
    # m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
    torch._foreach_lerp_(ms, grads, 1.0 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, grads, grads, value=1.0 - b2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_add_(denom, group["eps"])
    update = torch._foreach_div(ms, denom)
    if group["weight_decay"] > 0:
        # OAI: the L2 term sits inside the step, so it is scaled by lrt (incl. bias correction).
        torch._foreach_add_(update, params, alpha=group["weight_decay"])
    torch._foreach_add_(params, update, alpha=-lrt)


def _fused_update(
    params: list, grads: list, ms: list, vs: list, steps: list, t: float, group: dict
) -> None:
    """OAI's update through torch's fused AdamW kernel (`steps` already incremented).

    The kernel computes p <- p (1 - lr wd) - (lr / c1) m / (sqrt(v) / sqrt(c2) + eps') with
    c1 = 1 - b1^t, c2 = 1 - b2^t. With eps' = eps / sqrt(c2) and wd = l2 sqrt(c2) / c1 that is
    p - lrt (m / (sqrt(v) + eps) + l2 p), lrt = lr sqrt(c2) / c1: OAI's update, same moments.
    """
    b1, b2 = group["betas"]
    root_c2 = math.sqrt(1.0 - b2**t)
    torch._fused_adamw_(
        params,
        grads,
        ms,
        vs,
        [],
        steps,
        amsgrad=False,
        lr=float(group["lr"]),
        beta1=b1,
        beta2=b2,
        weight_decay=group["weight_decay"] * root_c2 / (1.0 - b1**t),
        eps=group["eps"] / root_c2,
        maximize=False,
        grad_scale=None,
        found_inf=None,
    )


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The configured optimizer over `model`'s parameters, with matrices-only weight decay."""
    groups = param_groups(model, cfg.weight_decay)
    betas = (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "oai":
        return OAIAdam(groups, lr=cfg.lr, betas=betas, eps=cfg.eps)
    # torch AdamW: decay is lr * wd * p (no bias-correction factor); fused kernels where supported.
    fused = all(p.device.type in ("cuda", "cpu") for g in groups for p in g["params"])
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, fused=fused)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, foreach=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
