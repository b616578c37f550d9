"""The chunked linear cross-entropy: `chunked_cross_entropy(hidden, weight, targets, weights)`.

sum_i weights_i * CE(hidden_i @ weight^T, targets_i), never materialising all `[tokens, vocab]`
logits at once: a custom autograd function walks the rows in chunks and, since the loss is the
last op, computes each chunk's gradient with respect to the hidden states and the output weight
*in the forward pass* (softmax - one-hot, two matmuls), keeping only those two gradients.
Backward merely scales them by the incoming gradient. That costs the same three matmuls as the
plain loss and peaks at one chunk of logits, instead of the full fp32 logits, their log-softmax
and its gradient (about 2 GB each for the paper's model at 8 x 512 tokens). Under bf16 autocast
the matmuls run in bf16 and the softmax in fp32, as autocast does for `F.linear` +
`F.cross_entropy`.

Per chunk the `[n, V]` work is: the logits matmul (`aligned_logits`: fp32 rows padded to 64
bytes), an fp32 softmax turned into softmax - onehot in place (on CPU through one small reused
fp32 buffer for bf16 logits: no fresh `[n, V]` tensor, whose page faults cost more than the
softmax), and the two gradient matmuls; the loss is -log p[target] and the per-row weights scale
the `[n, C]` operands. The LM losses (`gpt1.train.objectives`) and the zero-shot scorer's logits
(`gpt1.inference.scoring`) use it.
"""

from __future__ import annotations

import math

import torch

from gpt1.inplace import softmax_

# At most this many logits per chunk (64 MiB in fp32): the chunk's temporaries are alive on top of
# every saved activation, so with the paper's 40478-token vocabulary 4096 rows would add ~1.3 GB
# to the step's peak; smaller blocks also stay below glibc's mmap threshold and get reused
# instead of page-faulted anew.
CHUNK_ELEMENTS = 1 << 24


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    chunk: int = 4096,
) -> torch.Tensor:
    """sum_i weights_i * CE(hidden_i @ weight^T, targets_i); hidden `[N, C]`, weight `[V, C]`.

    `weights` are constants (for a mean: 1 / count on real targets, 0 on ignored ones). A chunk
    is at most `chunk` rows and at most `CHUNK_ELEMENTS` logits.
    """
    chunk = max(1, min(int(chunk), CHUNK_ELEMENTS // max(weight.shape[0], 1)))
    dtype = _compute_dtype(hidden)
    want_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(hidden.device.type, enabled=False):
        return _ChunkedLinearCrossEntropy.apply(
            hidden, weight, targets, weights.float(), chunk, dtype, want_grad
        )


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i * CE(h_i @ W^T, y_i) with gradients computed chunk by chunk in forward."""

    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        weights: torch.Tensor,
        chunk: int,
        dtype: torch.dtype,
        want_grad: bool,
    ) -> torch.Tensor:
        # Forward always runs with grad disabled, so the caller says whether gradients are wanted
        # (under torch.no_grad, e.g. evaluation, they are not even though weights require them).
        need_h = want_grad and ctx.needs_input_grad[0]
        need_w = want_grad and ctx.needs_input_grad[1]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w: torch.Tensor | None = None
        w_c = weight.to(dtype)
        V = w_c.shape[0]
        for start in range(0, hidden.shape[0], chunk):
            h32 = hidden[start : start + chunk]  # [n, C]
            h = h32.to(dtype)
            wt = weights[start : start + chunk].unsqueeze(1)  # [n, 1]
            idx = targets[start : start + chunk].clamp_min(0).unsqueeze(1)  # [n, 1]
            padded = aligned_logits(h, w_c)  # [n, width]
            need = need_h or need_w
            # In place: logits -> softmax - onehot (d CE / d logits) when gradients are wanted.
            p = _softmax_minus_onehot_(padded, idx, need)  # [n] fp32 p[target]
            logits = padded[:, :V]  # [n, V] view
            nll = -torch.log(p)
            tiny = p < 1e-30
            if bool(tiny.any()):
                # -log of a normal fp32 probability is as exact as logsumexp - logit; only an
                # underflowing one (a loss above 69 nats, e.g. divergence) needs recomputing.
                rows = tiny.nonzero().squeeze(1)
                lg = (h[rows] @ w_c.t()).float()  # [k, V]
                nll[rows] = torch.logsumexp(lg, 1) - lg.gather(1, idx[rows]).squeeze(1)
            total += (nll * wt.squeeze(1)).sum()
            if not need:
                continue
            # The per-row weights are applied to the small [n, C] operands, not to [n, V].
            dlogits = logits
            del logits, padded
            if need_h:
                torch.mul(dlogits @ w_c, wt, out=grad_h[start : start + chunk])
            if need_w:
                hw = (h32 * wt).to(dtype)  # [n, C], rounded once
                if grad_w is None:
                    grad_w = (dlogits.t() @ hw).float()  # [V, C]
                elif dtype == torch.float32:
                    grad_w.addmm_(dlogits.t(), hw)  # accumulates in the GEMM
                else:
                    grad_w.add_(dlogits.t() @ hw)  # promotes bf16 in place
        if need_w and grad_w is None:  # no rows at all
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        # Gradients are kept on ctx (not inputs or outputs); backward only scales them.
        ctx.grad_h, ctx.grad_w, ctx.weight_dtype = grad_h, grad_w, weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        gh = gw = None
        # In place: ctx owns these buffers and backward runs once (no retain_graph use).
        if ctx.grad_h is not None:
            gh = ctx.grad_h.mul_(grad_out.to(ctx.grad_h.dtype))
        if ctx.grad_w is not None:
            gw = ctx.grad_w.mul_(grad_out).to(ctx.weight_dtype)
        ctx.grad_h = ctx.grad_w = None
        return gh, gw, None, None, None, None, None


def logits_width(V: int, dtype: torch.dtype) -> int:
    """Row length of a logits buffer for V tokens: in fp32, V rounded up to 16 (64 bytes).

    With GPT-1's 40,478 (or 40,481) tokens an fp32 GEMM writing unaligned rows ran 1.3x slower
    on the CPU (`benchmarks/logits_alignment.py`), and the whole chunked loss 1.11x (also at the
    mini run's 7,858). bf16 showed no difference (0.95-1.10x, noise), so 16-bit rows stay V long.
    """
    return -(-V // 16) * 16 if dtype == torch.float32 else V


def aligned_logits(
    h: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`h @ w.T` in rows of `logits_width` columns `[n, width]`, the columns past V set to -inf.

    -inf columns get probability 0 in a softmax and a zero gradient, so callers may use the whole
    rows or their first V columns. `out` is a reusable buffer of at least `[n, width]`.
    """
    n, V = h.shape[0], w.shape[0]
    width = logits_width(V, h.dtype)
    if out is None:
        if width == V:
            return h @ w.t()
        out = torch.empty(n, width, dtype=h.dtype, device=h.device)
    out = out[:n, :width]
    torch.mm(h, w.t(), out=out[:, :V])
    out[:, V:] = -math.inf
    return out


# Rows per softmax block on CPU: the fp32 block (8 MiB) is allocated once per chunk and reused.
_BLOCK_ELEMENTS = 1 << 21


def _softmax_minus_onehot_(logits: torch.Tensor, idx: torch.Tensor, grad: bool) -> torch.Tensor:
    """Return p[target] `[n]` (fp32); with `grad`, overwrite logits `[n, V]` by softmax - onehot.

    The softmax is computed in fp32 whatever the logits' dtype (as autocast does for
    cross-entropy). On CPU it runs in place on row blocks copied into one reused fp32 buffer: a
    fresh `[n, V]` tensor there costs a page fault per 4 KiB, more than the softmax itself.
    """
    n, V = logits.shape
    if logits.device.type != "cpu" or not hasattr(torch.ops.aten._softmax, "out"):
        probs = torch.softmax(logits, dim=1, dtype=torch.float32)  # [n, V]
        p = probs.gather(1, idx).squeeze(1)
        if grad:
            probs.scatter_add_(1, idx, torch.full_like(p, -1.0).unsqueeze(1))
            logits.copy_(probs)
        return p
    rows = max(1, min(n, _BLOCK_ELEMENTS // max(V, 1)))
    in_place = logits.dtype == torch.float32
    buf = None if in_place else torch.empty(rows, V, dtype=torch.float32, device=logits.device)
    p = torch.empty(n, dtype=torch.float32, device=logits.device)
    minus_one = torch.full((rows, 1), -1.0, device=logits.device)
    for r in range(0, n, rows):
        blk = logits[r : r + rows]  # [b, V]
        work = blk if in_place else buf[: blk.shape[0]].copy_(blk)
        softmax_(work, 1)
        i = idx[r : r + rows]
        p[r : r + rows] = work.gather(1, i).squeeze(1)
        if grad:
            work.scatter_add_(1, i, minus_one[: blk.shape[0]])
            if not in_place:
                blk.copy_(work)
    return p


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype
