"""GPT-1, exactly: post-LN decoder blocks, learned positions, tied output layer.

The model maps token ids to final hidden states; heads and losses live elsewhere (`heads.py`,
`objectives.py`). It is single-device code: no distributed, autocast or compile logic here.
Parameter names follow GPT-2/HF (`wte`, `wpe`, `h.{i}.attn.c_attn`, ...) so conversion is a rename
plus transposes.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.config import ModelConfig
from gpt1.inplace import softmax_, softmax_backward_
from gpt1.masks import keep_mask


def _rational_rate(p: float) -> tuple[int, int] | None:
    """(num, den) with num/den == p exactly (as floats) and den <= 255, else None."""
    frac = Fraction(p).limit_denominator(255)
    return (frac.numerator, frac.denominator) if float(frac) == p else None


class _MaskDropout(torch.autograd.Function):
    """Dropout with a `keep_mask` (drop rate exactly num/den): on CPU several times cheaper
    than `bernoulli_`, and dropout runs 19 times per step of the mini model."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, num: int, den: int) -> torch.Tensor:
        keep = keep_mask(x.shape, num, den, x.dtype)
        ctx.scale = den / (den - num)
        ctx.save_for_backward(keep)
        # A bool operand would be converted to a float copy first on CPU, about 3x slower.
        return x.mul(keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout`, faster on CPU for rates with a small exact fraction (0.1 = 1/10)."""
    if not training or p == 0.0:
        return x
    rate = _rational_rate(p) if x.device.type == "cpu" else None
    if rate is None:  # GPUs have fused dropout kernels; odd rates keep torch's exact sampler
        return F.dropout(x, p, True)
    return _MaskDropout.apply(x, *rate)


class Dropout(nn.Dropout):
    """`nn.Dropout` using `dropout` above (same module type, same state)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def causal_attention_cpu_train(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               p: float) -> torch.Tensor:
    """Causal attention with dropout, written out: q, k, v `[B, H, T, D]` -> `[B, H, T, D]`.

    On CPU, SDPA has no fused kernel with dropout and falls back to a generic path that is
    slower than these four ops (about 2x in bf16). Same maths: masked scores are -inf. Under
    bf16 autocast the softmax output is bf16 (accumulated in fp32), as in transformers' eager
    attention; SDPA's generic path would upcast to fp32.
    """
    rate = _rational_rate(p) if p > 0 else None
    if rate is not None:
        return _CausalAttentionDropout.apply(q, k, v, *rate)
    return torch.matmul(dropout(_causal_probs(q, k), p, True), v)


def _causal_probs(q: torch.Tensor, k: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + causal -inf mask): `[B, H, T, D]` x 2 -> `[B, H, T, T]`.

    The mask is always added in place (autograd does not need the scores); with `in_place`
    (no autograd through the result) the softmax overwrites them too (`gpt1.inplace`).
    """
    T = q.shape[-2]
    mask = torch.full((T, T), float("-inf"), device=q.device).triu_(1)  # [T, T]
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.shape[-1]))  # [B, H, T, T]
    scores.add_(mask.to(scores.dtype))
    return softmax_(scores) if in_place and scores.device.type == "cpu" else scores.softmax(-1)


# Above this many bytes of attention probabilities per layer, backward recomputes them from q and
# k (one more q k^T and softmax) instead of keeping them: the paper's model at 8 x 512 tokens
# holds 100 MB per layer in fp32, 1.2 GB in all; the mini model's 12 MB stay saved (faster).
RECOMPUTE_PROBS_BYTES = 32 << 20


class _CausalAttentionDropout(torch.autograd.Function):
    """dropout(softmax(q k^T / sqrt(D), causal)) @ v keeping at most the probabilities + keep-mask.

    Autograd would keep the probabilities and the dropped probabilities (two `[B, H, T, T]`
    tensors per layer) plus a bool mask; this keeps the 1-byte mask and, below
    `RECOMPUTE_PROBS_BYTES`, the probabilities. Same mask draws as `dropout`. Under autocast the
    inputs are cast once here, so a recomputation in backward repeats the forward exactly.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num: int,
                den: int) -> torch.Tensor:
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        if torch.is_autocast_enabled(q.device.type):
            dt = torch.get_autocast_dtype(q.device.type)
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
        with torch.autocast(q.device.type, enabled=False):
            probs = _causal_probs(q, k, in_place=True)                      # [B, H, T, T]
            ctx.scale = den / (den - num)
            ctx.recompute = probs.numel() * probs.element_size() > RECOMPUTE_PROBS_BYTES
            # Large (recomputed) layers keep a 1-byte mask; small ones one in the probabilities'
            # 16-bit dtype, which multiplies faster (see keep_mask).
            mask_dtype = torch.uint8 if ctx.recompute else probs.dtype
            keep = keep_mask(probs.shape, num, den, mask_dtype)             # [B, H, T, T]
            ctx.save_for_backward(q, k, v, keep, None if ctx.recompute else probs)
            # The 1 / (1 - p) scale goes on the 4x smaller [B, H, T, D] side; unsaved
            # probabilities are dropped in place (no fresh [B, H, T, T] buffer).
            dropped = probs.mul_(keep) if ctx.recompute else probs.mul(keep)
            return torch.matmul(dropped, v).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, k, v, keep, probs = ctx.saved_tensors
        if probs is None:
            probs = _causal_probs(q, k, in_place=True)
        grad = grad.to(v.dtype).mul(ctx.scale)                              # [B, H, T, D]
        grad_probs = torch.matmul(grad, v.transpose(-1, -2)).mul_(keep)     # [B, H, T, T]
        # In place, reusing the [B, H, T, T] buffers (fresh ones page-fault on CPU): backward runs
        # once, so the saved probabilities may be overwritten once their last reader is done.
        grad_scores = softmax_backward_(grad_probs, probs)
        grad_v = torch.matmul(probs.mul_(keep).transpose(-1, -2), grad)     # [B, H, T, D]
        grad_scores.mul_(1.0 / math.sqrt(q.shape[-1]))
        grad_q = torch.matmul(grad_scores, k)                               # [B, H, T, D]
        grad_k = torch.matmul(grad_scores.transpose(-1, -2), q)             # [B, H, T, D]
        dq, dk, dv = ctx.dtypes
        return grad_q.to(dq), grad_k.to(dk), grad_v.to(dv), None, None


class LayerCache:
    """One layer's keys and values of the positions seen so far (incremental decoding).

    Exact for GPT-1: with causal attention, a position's keys and values depend only on the
    tokens up to it, and post-LN changes nothing about that.

    The keys and values live in buffers with room to spare (doubled when full), written in place:
    concatenating a fresh `[B, H, past + T, D]` pair per layer and step costs an allocation and
    a copy of the whole cache every token. Attention reads views of the filled part, the same
    numbers the concatenated tensors held.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None   # [B, H, capacity, D] buffers
        self.v: torch.Tensor | None = None
        self.length = 0                      # filled positions

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new keys/values `[B, H, T, D]`; return all of them `[B, H, past + T, D]`."""
        end = self.length + k.shape[2]
        if self.k is None or end > self.k.shape[2]:
            capacity = max(2 * end, 64)
            self.k = self._grown(self.k, k, capacity)
            self.v = self._grown(self.v, v, capacity)
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def _grown(self, old: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
        B, H, _, D = like.shape
        buf = like.new_empty(B, H, capacity, D)
        if old is not None:
            buf[:, :, :self.length] = old[:, :, :self.length]
        return buf


class KVCache:
    """Per-layer `LayerCache`s of one decoding run; `len(cache)` is the number of cached positions."""

    def __init__(self, n_layer: int) -> None:
        self.layers = [LayerCache() for _ in range(n_layer)]

    def __len__(self) -> int:
        return self.layers[0].length


class Unpadded:
    """Where the real tokens of a right-padded `[B, T]` batch sit among its B*T positions.

    Everything in a block but attention is position-wise, so it can run on the real tokens
    alone (`[N, C]`); attention needs rows, and runs on `pad(...)`-ed `[B, T, ...]` tensors whose
    padding, being after every real token, is never attended to by one.
    """

    def __init__(self, lengths: torch.Tensor, T: int):
        self.B, self.T = lengths.shape[0], T
        keep = torch.arange(T, device=lengths.device) < lengths[:, None]   # [B, T]
        self.index = keep.flatten().nonzero().squeeze(1)                    # [N] flat positions

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """`[N, F]` -> `[B, T, F]`, zeros at padding."""
        full = x.new_zeros(self.B * self.T, x.shape[-1])
        return full.index_copy(0, self.index, x).view(self.B, self.T, -1)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, T, F]` -> `[N, F]`, the real positions in row-major order."""
        return x.reshape(self.B * self.T, -1).index_select(0, self.index)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q|k|v projection (GPT-1's `c_attn`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_pdrop = config.attn_pdrop
        self.resid_dropout = Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None,
                layout: Unpadded | None = None) -> torch.Tensor:
        """x `[B, T, C]`, or the real tokens `[N, C]` of a padded batch described by `layout`."""
        qkv = self.c_attn(x)
        if layout is not None:
            qkv = layout.pad(qkv)                                # [N, 3C] -> [B, T, 3C]
        B, T, C = qkv.shape[0], qkv.shape[1], x.shape[-1]
        # [B, T, 3C] -> [B, T, 3, H, D] -> 3 x [B, H, T, D]; the split order is q | k | v as in OAI.
        q, k, v = qkv.view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        mask, causal = None, True
        if cache is not None:
            k, v = cache.extend(k, v)  # [B, H, past + T, D]
            past = k.shape[2] - T
            if past:
                # New queries see every cached key and the new keys up to their own position.
                causal = False
                if T > 1:
                    mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
        if self.training and self.attn_pdrop > 0 and x.device.type == "cpu" and cache is None:
            y = causal_attention_cpu_train(q, k, v, self.attn_pdrop)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.attn_pdrop if self.training else 0.0,
                is_causal=causal)
        y = y.transpose(1, 2).reshape(B, T, C)  # [B, H, T, D] -> [B, T, C]
        if layout is not None:
            y = layout.unpad(y)                   # [B, T, C] -> [N, C]
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward layer: c_fc -> GELU (tanh approximation) -> c_proj."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.n_inner)
        self.c_proj = nn.Linear(config.n_inner, config.n_embd)
        self.approximate_gelu = config.afn == "gelu"
        self.dropout = Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        h = F.gelu(h, approximate="tanh") if self.approximate_gelu else F.relu(h)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """Post-LN transformer block: LayerNorm after each residual add (original Transformer style)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn = CausalSelfAttention(config)
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None,
                layout: Unpadded | None = None) -> torch.Tensor:
        x = self.ln_1(x + self.attn(x, cache, layout))
        return self.ln_2(x + self.mlp(x))


class GPT(nn.Module):
    """The GPT-1 decoder: `GPT(config)(ids)` -> hidden states `[B, T, n_embd]`.

    No input LayerNorm and no final LayerNorm (GPT-1 is post-LN). The output layer is the token
    embedding itself: `lm_logits(hidden) = hidden @ wte.weight.T`.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        # Activation checkpointing per block (trades compute for memory); set by the trainer.
        self.gradient_checkpointing = False
        self._dropped_wte: torch.Tensor | None = None
        self.reset_parameters()

    # ------------------------------------------------------------------ init
    def reset_parameters(self) -> None:
        """N(0, initializer_range) for every weight matrix and embedding, zero biases, unit gains."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    # --------------------------------------------------------------- forward
    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache: KVCache | None = None, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """ids `[B, T]` (int64) -> hidden states `[B, T, n_embd]`.

        With `cache` (inference only), `ids` continue the cached positions and the cache grows.
        With `lengths` `[B]`, row b is right-padded after its first `lengths[b]` tokens: every
        position-wise layer skips the padding, whose hidden states come back as zeros. The real
        positions' states are those of the padded batch (causal attention never lets a token see
        later padding), computed on the real tokens only.
        """
        past = len(cache) if cache is not None else 0
        B, T = ids.shape[0], ids.shape[-1]
        if past + T > self.config.n_positions:
            raise ValueError(f"sequence of {past + T} tokens is longer than n_positions="
                             f"{self.config.n_positions}")
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=ids.device)
        layout = self._layout(ids, lengths, cache)
        if layout is not None:
            ids = layout.unpad(ids.reshape(B, T, 1)).squeeze(1)                       # [N]
            position_ids = layout.unpad(position_ids.expand(B, T).reshape(B, T, 1)).squeeze(1)
        x = self._embed(ids, position_ids)
        for i, block in enumerate(self.h):
            if cache is not None:
                x = block(x, cache.layers[i])
            elif self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, None, layout, use_reentrant=False)
            else:
                x = block(x, None, layout)
        return layout.pad(x) if layout is not None else x

    def _layout(self, ids: torch.Tensor, lengths: torch.Tensor | None,
                cache: KVCache | None) -> Unpadded | None:
        """The unpadded layout for `lengths`, or None where there is no padding to skip."""
        if lengths is None:
            return None
        if cache is not None or ids.dim() != 2:
            raise ValueError("lengths needs ids [B, T] and no cache")
        lengths = lengths.to(ids.device)
        if lengths.shape != ids.shape[:1] or bool((lengths < 0).any() | (lengths > ids.shape[1]).any()):
            raise ValueError(f"lengths must be [B] = [{ids.shape[0]}] values in 0..{ids.shape[1]}; "
                             f"got shape {list(lengths.shape)}")
        if bool((lengths == ids.shape[1]).all()):
            return None
        return Unpadded(lengths, ids.shape[1])

    def _embed(self, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Token + position embeddings (with embedding dropout), any leading shape."""
        if self.training and self.config.embd_dropout == "matrix" and self.config.embd_pdrop > 0:
            # OAI: dropout on the embedding tables before the gather; the tied output layer of
            # this forward pass sees the same dropped token table.
            wte = self.drop(self.wte.weight)
            self._dropped_wte = wte
            return F.embedding(ids, wte) + F.embedding(position_ids, self.drop(self.wpe.weight))
        self._dropped_wte = None
        return self.drop(self.wte(ids) + self.wpe(position_ids))

    def lm_weight(self) -> torch.Tensor:
        """The output layer's weight `[vocab_size, n_embd]`: the (possibly dropped) token table."""
        if self.training and self._dropped_wte is not None:
            return self._dropped_wte
        return self.wte.weight

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied-head logits: hidden `[..., n_embd]` -> `[..., vocab_size]`."""
        return F.linear(hidden, self.lm_weight())

    # ----------------------------------------------------------- task tokens
    def add_tokens(self, n: int, generator: torch.Generator | None = None) -> list[int]:
        """Append `n` token rows initialised N(0, initializer_range); return their ids.

        These are the paper's start / delimiter / extract tokens; the tied output layer covers
        them automatically because it is the token table itself.
        """
        return grow_token_table(self, n, generator)

    # ---------------------------------------------------------------- counts
    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameter count; with `exclude_embeddings`, without the token and position tables."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= self.wte.weight.numel() + self.wpe.weight.numel()
        return total


@torch.no_grad()
def grow_token_table(model: nn.Module, n: int, generator: torch.Generator | None = None) -> list[int]:
    """Append `n` rows drawn from N(0, initializer_range) to `model.wte` (any model with a `wte`
    table and a `config` with `vocab_size`); return the new ids."""
    if n <= 0:
        return []
    old = model.wte.weight
    rows = torch.randn(n, old.shape[1], generator=generator, dtype=torch.float32)
    rows = (rows * model.config.initializer_range).to(device=old.device, dtype=old.dtype)
    table = nn.Embedding(old.shape[0] + n, old.shape[1], device=old.device, dtype=old.dtype)
    table.weight.copy_(torch.cat([old, rows], dim=0))  # [V + n, C]
    model.wte = table
    first = model.config.vocab_size
    model.config.vocab_size += n
    return list(range(first, first + n))


def parameter_count(config: ModelConfig, exclude_embeddings: bool = False) -> int:
    """Parameters of a model with `config`, computed without allocating it."""
    C, F_, L = config.n_embd, config.n_inner, config.n_layer
    per_block = (C * 3 * C + 3 * C) + (C * C + C) + (C * F_ + F_) + (F_ * C + C) + 4 * C
    emb = 0 if exclude_embeddings else (config.vocab_size + config.n_positions) * C
    return L * per_block + emb


def flops_per_token(config: ModelConfig, seq_len: int | None = None) -> float:
    """Training FLOPs per token: 6N (N = matrices incl. the tied output layer) plus attention.

    Attention scores and the weighted sum cost 2 * 2 * T * C multiply-adds per token and layer in
    the forward pass (causal masking is not credited), times 3 for forward + backward.
    """
    T = seq_len or config.n_positions
    n = parameter_count(config) - config.n_positions * config.n_embd  # positions are a gather
    return 6.0 * n + 12.0 * config.n_layer * T * config.n_embd


