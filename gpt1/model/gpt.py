"""GPT-1, exactly: post-LN decoder blocks, learned positions, tied output layer.

Read top to bottom as the paper: attention, MLP, block, GPT; then the helper for right-padded
batches, and the parameter and FLOP counts. The key/value caches of incremental decoding live in
`gpt1.model.decoding`.

The model maps token ids to final hidden states; heads and losses live elsewhere
(`gpt1.model.heads`, `gpt1.train.objectives`). It is single-device code: no distributed, autocast
or compile logic here, and no state kept between calls. Its CPU fast paths are behind one seam
(`gpt1.model.fast_cpu`: drop-ins for dropout and causal SDPA); activation checkpointing is
applied from outside (`gpt1.train.parallelize`). Parameter names follow GPT-2/HF (`wte`, `wpe`,
`h.{i}.attn.c_attn`, ...) so conversion is a rename plus transposes.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.config import ModelConfig
from gpt1.model.decoding import KVCache, LayerCache, LoopStep, PooledStep, decode_step
from gpt1.model.fast_cpu import Dropout, causal_attention


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q|k|v projection (GPT-1's `c_attn`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_pdrop = config.attn_pdrop
        self.resid_dropout = Dropout(config.resid_pdrop)

    def forward(
        self, x: torch.Tensor, cache: LayerCache | None = None, layout: Unpadded | None = None
    ) -> torch.Tensor:
        """x `[B, T, C]`, or the real tokens `[N, C]` of a padded batch described by `layout`."""
        qkv = self.c_attn(x)
        if layout is not None:
            qkv = layout.pad(qkv)  # [N, 3C] -> [B, T, 3C]
        B, T, C = qkv.shape[0], qkv.shape[1], x.shape[-1]
        # [B, T, 3C] -> [B, T, 3, H, D] -> 3 x [B, H, T, D]; the split order is q | k | v as in OAI.
        q, k, v = qkv.view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        p = self.attn_pdrop if self.training else 0.0
        if cache is None:
            y = causal_attention(q, k, v, p)  # SDPA(is_causal=True), or its CPU fast path
        else:
            y = self._attend_cached(q, k, v, cache, p)
        y = y.transpose(1, 2).reshape(B, T, C)  # [B, H, T, D] -> [B, T, C]
        if layout is not None:
            y = layout.unpad(y)  # [B, T, C] -> [N, C]
        return self.resid_dropout(self.c_proj(y))

    def forward_at(
        self, x: torch.Tensor, positions: torch.Tensor, layout: Unpadded | None = None
    ) -> torch.Tensor:
        """The attention output at one position per row only: x `[B, T, C]` (or `[N, C]` with
        `layout`), positions `[B]` -> `[B, C]`. Keys and values still cover every position
        up to each row's own.

        In training with attention dropout, attention runs at every position through the same
        seam as `forward` (same dropout, same random draws) and the rows are picked after it, so
        the attention output equals `forward`'s; only without dropout does one query per row
        suffice."""
        qkv = self.c_attn(x)
        if layout is not None:
            qkv = layout.pad(qkv)  # [N, 3C] -> [B, T, 3C]
        B, T, C = qkv.shape[0], qkv.shape[1], x.shape[-1]
        q, k, v = qkv.view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        rows = torch.arange(B, device=x.device)
        p = self.attn_pdrop if self.training else 0.0
        if p > 0:
            y = causal_attention(q, k, v, p)[rows, :, positions]  # [B, H, D]
        else:
            q = q[rows, :, positions].unsqueeze(2)  # [B, H, 1, D]
            visible = torch.arange(T, device=x.device) <= positions[:, None]  # [B, T]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None, None, :])
        return self.resid_dropout(self.c_proj(y.reshape(B, C)))

    def decode(self, x: torch.Tensor, step: LoopStep | PooledStep, layer: int) -> torch.Tensor:
        """One new token for each of n independent sequences, each with its own cache: x `[n, C]`
        -> `[n, C]` (inference). The projections run on all n rows at once; `step` attends each
        row over its own cached keys (`gpt1.model.decoding`)."""
        n, C = x.shape
        qkv = self.c_attn(x).view(n, 3, self.n_head, 1, self.head_dim)  # [n, 3, H, 1, D]
        q, k, v = qkv.unbind(1)  # 3 x [n, H, 1, D]
        y = step.attend(layer, q, k, v).reshape(n, C)  # [n, H, 1, D] -> [n, C]
        return self.resid_dropout(self.c_proj(y))

    @staticmethod
    def _attend_cached(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerCache, p: float
    ) -> torch.Tensor:
        """Attention of new queries `[B, H, T, D]` over the cached and the new keys and values."""
        T = q.shape[2]
        k, v = cache.extend(k, v)  # [B, H, past + T, D]
        past = k.shape[2] - T
        mask = None
        if past and T > 1:
            # New queries see every cached key and the new keys up to their own position.
            mask = torch.ones(T, past + T, dtype=torch.bool, device=q.device).tril(past)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=p, is_causal=not past
        )


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

    def forward(
        self, x: torch.Tensor, cache: LayerCache | None = None, layout: Unpadded | None = None
    ) -> torch.Tensor:
        x = self.ln_1(x + self.attn(x, cache, layout))
        return self.ln_2(x + self.mlp(x))

    def forward_at(
        self, x: torch.Tensor, positions: torch.Tensor, layout: Unpadded | None = None
    ) -> torch.Tensor:
        """`forward`'s output at one position per row only: `[B, C]` (see `GPT.forward`'s
        `at`): everything after attention runs on B rows instead of every token."""
        rows = torch.arange(positions.shape[0], device=x.device)
        here = (layout.pad(x) if layout is not None else x)[rows, positions]  # [B, C]
        h = self.ln_1(here + self.attn.forward_at(x, positions, layout))
        return self.ln_2(h + self.mlp(h))

    def decode(self, x: torch.Tensor, step: LoopStep | PooledStep, layer: int) -> torch.Tensor:
        """`forward` for one new token of each of n sequences: x `[n, C]` (see `GPT.decode`)."""
        x = self.ln_1(x + self.attn.decode(x, step, layer))
        return self.ln_2(x + self.mlp(x))


class LMOutput(NamedTuple):
    """What a forward pass gives the language-model head: the hidden states and the tied output
    weight to use with them (the token table this pass embedded with, dropout included)."""

    hidden: torch.Tensor  # [B, T, n_embd]
    head_weight: torch.Tensor  # [vocab_size, n_embd]


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
    def forward(
        self,
        ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        lengths: torch.Tensor | None = None,
        *,
        with_head_weight: bool = False,
        at: torch.Tensor | None = None,
    ) -> torch.Tensor | LMOutput:
        """ids `[B, T]` (int64) -> hidden states `[B, T, n_embd]`.

        With `cache` (inference only), `ids` continue the cached positions and the cache grows.
        With `lengths` `[B]`, row b is right-padded after its first `lengths[b]` tokens: every
        position-wise layer skips the padding, whose hidden states come back as zeros. The real
        positions' states are those of the padded batch (causal attention never lets a token see
        later padding), computed on the real tokens only. With `with_head_weight`, returns
        `LMOutput(hidden, head_weight)`: what a training loss needs for the tied output layer.
        With `at` `[B]` (one position per row, no cache), returns only the final hidden state at
        `at[b]` of each row, `[B, n_embd]`: what a classification head reads. The last block
        then runs after attention on those B positions alone (about a sixteenth of the work of
        a forward pass saved, in the same maths; in training, attention dropout included).
        """
        past = len(cache) if cache is not None else 0
        B, T = ids.shape[0], ids.shape[-1]
        if past + T > self.config.n_positions:
            raise ValueError(
                f"sequence of {past + T} tokens is longer than n_positions="
                f"{self.config.n_positions}"
            )
        if at is not None:
            if cache is not None or with_head_weight or ids.dim() != 2:
                raise ValueError("at needs ids [B, T], no cache and no head weight")
            at = at.to(ids.device)
            if at.shape != (B,) or bool(((at < 0) | (at >= T)).any()):
                raise ValueError(f"at must be [B] = [{B}] positions in 0..{T - 1}")
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=ids.device)
        layout = self._layout(ids, lengths, cache)
        if layout is not None:
            ids = layout.unpad(ids.reshape(B, T, 1)).squeeze(1)  # [N]
            position_ids = layout.unpad(position_ids.expand(B, T).reshape(B, T, 1)).squeeze(1)
        x, head_weight = self._embed(ids, position_ids)
        if at is not None:
            for block in self.h[:-1]:
                x = block(x, None, layout)
            return self.h[-1].forward_at(x, at, layout)
        for i, block in enumerate(self.h):
            x = block(x, cache.layers[i] if cache is not None else None, layout)
        hidden = layout.pad(x) if layout is not None else x
        return LMOutput(hidden, head_weight) if with_head_weight else hidden

    def decode(self, ids: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
        """The next token of each of n independent sequences: ids `[n]` -> hidden `[n, n_embd]`.

        Sequence r continues `caches[r]` (filled by earlier `forward(..., cache=)` calls, of any
        lengths) by `ids[r]`, and its cache grows by one. This is continuous batching: the weights
        are read once for all n sequences instead of once each, and with caches from one
        `SlotPool` attention is one call per layer for all of them. The result for sequence r is
        what `forward(ids[r].view(1, 1), cache=caches[r])[0, -1]` gives, up to the summation
        order of the larger matrix products.
        """
        if ids.dim() != 1 or len(caches) != ids.shape[0]:
            raise ValueError(
                f"decode needs ids [n] and n caches; got {list(ids.shape)}, {len(caches)}"
            )
        positions = torch.tensor([len(c) for c in caches], device=ids.device)
        if bool((positions >= self.config.n_positions).any()):
            raise ValueError(
                f"a cache already holds n_positions={self.config.n_positions} tokens: no room"
            )
        x, _ = self._embed(ids, positions)  # [n, C]
        step = decode_step(caches)  # one attention call per layer for pooled caches
        for i, block in enumerate(self.h):
            x = block.decode(x, step, i)
        return x

    def _layout(
        self, ids: torch.Tensor, lengths: torch.Tensor | None, cache: KVCache | None
    ) -> Unpadded | None:
        """The unpadded layout for `lengths`, or None where there is no padding to skip."""
        if lengths is None:
            return None
        if cache is not None or ids.dim() != 2:
            raise ValueError("lengths needs ids [B, T] and no cache")
        lengths = lengths.to(ids.device)
        if lengths.shape != ids.shape[:1] or bool(
            (lengths < 0).any() | (lengths > ids.shape[1]).any()
        ):
            raise ValueError(
                f"lengths must be [B] = [{ids.shape[0]}] values in 0..{ids.shape[1]}; "
                f"got shape {list(lengths.shape)}"
            )
        if bool((lengths == ids.shape[1]).all()):
            return None
        return Unpadded(lengths, ids.shape[1])

    def _embed(
        self, ids: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token + position embeddings (with embedding dropout), any leading shape, and the token
        table the tied output layer must use with them."""
        if self.training and self.config.embd_dropout == "matrix" and self.config.embd_pdrop > 0:
            # OAI: dropout on the embedding tables before the gather; the tied output layer of
            # this forward pass sees the same dropped token table.
            wte = self.drop(self.wte.weight)
            return F.embedding(ids, wte) + F.embedding(
                position_ids, self.drop(self.wpe.weight)
            ), wte
        return self.drop(self.wte(ids) + self.wpe(position_ids)), self.wte.weight

    def lm_weight(self) -> torch.Tensor:
        """The output layer's weight `[vocab_size, n_embd]`: the token table (for a training pass
        with matrix embedding dropout, use `forward(..., with_head_weight=True)` instead)."""
        return self.wte.weight

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied-head logits: hidden `[..., n_embd]` -> `[..., vocab_size]`."""
        # A packed copy of the token table when prepacked for CPU inference (see fast_cpu).
        kernel = self.__dict__.get("lm_head_kernel")
        if kernel is not None:
            return kernel.linear(hidden, self.lm_weight(), None)
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

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token at `seq_len` (default n_positions); see `flops_per_token`."""
        return flops_per_token(self.config, seq_len)


# ------------------------------------------------------------------- padding helper
class Unpadded:
    """Where the real tokens of a right-padded `[B, T]` batch sit among its B*T positions.

    Everything in a block but attention is position-wise, so it can run on the real tokens
    alone (`[N, C]`); attention needs rows, and runs on `pad(...)`-ed `[B, T, ...]` tensors whose
    padding, being after every real token, is never attended to by one.
    """

    def __init__(self, lengths: torch.Tensor, T: int):
        self.B, self.T = lengths.shape[0], T
        keep = torch.arange(T, device=lengths.device) < lengths[:, None]  # [B, T]
        self.index = keep.flatten().nonzero().squeeze(1)  # [N] flat positions
        self.rows_cols = (self.index // T, self.index % T)  # [N] row, [N] column

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """`[N, F]` -> `[B, T, F]`, zeros at padding (a fresh tensor, not a view: FSDP2 warns
        about modules returning views)."""
        full = x.new_zeros(self.B, self.T, x.shape[-1])
        return full.index_put_(self.rows_cols, x)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, T, F]` -> `[N, F]`, the real positions in row-major order."""
        return x.reshape(self.B * self.T, -1).index_select(0, self.index)


@torch.no_grad()
def grow_token_table(
    model: nn.Module, n: int, generator: torch.Generator | None = None
) -> list[int]:
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
    # A new config for this model only: configs are frozen, and the one it was built from may
    # be shared (a pretrained model and a fresh copy made from its config).
    model.config = dataclasses.replace(model.config, vocab_size=first + n)
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
