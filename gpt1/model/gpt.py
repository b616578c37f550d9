"""GPT-1, exactly: post-LN decoder blocks, learned positions, tied output layer.

Read top to bottom as the paper: attention, MLP, block, GPT; then the parameter and FLOP counts.

The model maps token ids to final hidden states; heads and losses live elsewhere
(`gpt1.model.heads`, `gpt1.train.objectives`). It is single-device code: no distributed, autocast
or compile logic here, and no state kept between calls. Attention goes through one seam
(`gpt1.model.attention`), dropout through `gpt1.model.fast_cpu.Dropout` (its CPU fast path);
activation checkpointing is applied from outside (`gpt1.train.parallelize`). Passes over part of a
batch (right-padded rows, one position per row) are layouts a block is given
(`gpt1.model.layouts`); decoding with key/value caches is `gpt1.inference.decoding`. Parameter names
follow GPT-2/HF (`wte`, `wpe`, `h.{i}.attn.c_attn`, ...) so conversion is a rename plus
transposes.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.config import ModelConfig
from gpt1.model.attention import attention, merge_heads, split_heads
from gpt1.model.fast_cpu import Dropout
from gpt1.model.layouts import AtPositions, Layout, Unpadded
from gpt1.model.tied import TiedLM


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q|k|v projection (GPT-1's `c_attn`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_pdrop = config.attn_pdrop
        self.resid_dropout = Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor, layout: Layout | None = None) -> torch.Tensor:
        """x `[B, T, C]` -> `[B, T, C]`; with a `layout`, the rows it describes."""
        qkv = self.c_attn(x)
        p = self.attn_pdrop if self.training else 0.0
        if layout is not None:
            return self.resid_dropout(self.c_proj(layout.attend(qkv, self.n_head, p)))
        q, k, v = split_heads(qkv, self.n_head)  # 3 x [B, H, T, D]
        y = attention(q, k, v, dropout_p=p, is_causal=True)  # [B, H, T, D]
        return self.resid_dropout(self.c_proj(merge_heads(y)))


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU in the tanh form GPT-1 uses."""
    return F.gelu(x, approximate="tanh")


class MLP(nn.Module):
    """Position-wise feed-forward layer: c_fc -> GELU (tanh approximation) -> c_proj."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.n_inner)
        self.c_proj = nn.Linear(config.n_inner, config.n_embd)
        # An attribute, so that inference may put a faster form of the same function in its
        # place (`gpt1.inference.activations`: torch's own bits, looked up).
        self.activation = gelu if config.afn == "gelu" else F.relu
        self.dropout = Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.activation(self.c_fc(x))))


class Block(nn.Module):
    """Post-LN transformer block: LayerNorm after each residual add (original Transformer style)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn = CausalSelfAttention(config)
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, x: torch.Tensor, layout: Layout | None = None) -> torch.Tensor:
        """x `[B, T, C]` -> `[B, T, C]`; with a `layout`, on the rows it describes (everything
        but attention is position-wise)."""
        a = self.attn(x, layout)
        x = self.ln_1((x if layout is None else layout.query_rows(x)) + a)
        return self.ln_2(x + self.mlp(x))


class HeadKernel(Protocol):
    """A faster `F.linear` for the tied output layer (`prepack.PackedWeight`, `quantize.Int8Head`)."""

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor: ...


class GPT(TiedLM):
    """The GPT-1 decoder: `GPT(config)(ids)` -> hidden states `[B, T, n_embd]`.

    No input LayerNorm and no final LayerNorm (GPT-1 is post-LN). The output layer is the token
    embedding itself: `lm_logits(hidden) = hidden @ wte.weight.T`. What every tied language model
    does the same way (`forward`'s options, `add_tokens`, the counts) is `TiedLM`'s.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        # The output layer's kernel for inference: None is `F.linear`; prepacking
        # (`prepack.prepack_for_inference`) and int8 (`quantize.quantize_int8_`) set one.
        self.lm_head_kernel: HeadKernel | None = None
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
    def hidden_states(
        self, ids: torch.Tensor, lengths: torch.Tensor | None, at: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids `[B, T]` (int64) -> hidden states `[B, T, n_embd]` (or `[B, n_embd]` `at` one
        position per row), and the token table the tied output layer must use with them
        (`forward`, `GPT(config)(ids, ...)`, is how it is called).

        With `lengths` `[B]`, every position-wise layer skips the padding, whose hidden states
        come back as zeros. The real positions' states are those of the padded batch (causal
        attention never lets a token see later padding), computed on the real tokens only
        (`layouts.Unpadded`). With `at`, the last block runs after attention on those B
        positions alone, in the same maths (`layouts.AtPositions`).
        """
        B, T = ids.shape
        if T > self.config.n_positions:
            raise ValueError(
                f"sequence of {T} tokens is longer than n_positions={self.config.n_positions}"
            )
        layout = Unpadded.of(ids, lengths)  # None: no padding to skip
        top = AtPositions.of(at, ids, layout) if at is not None else layout
        positions = torch.arange(T, device=ids.device)
        if layout is not None:
            ids, positions = layout.tokens(ids), layout.tokens(positions.expand(B, T))  # [N]
        x, head_weight = self.embed(ids, positions)
        for block in self.h[:-1]:
            x = block(x, layout)
        x = self.h[-1](x, top)
        if at is None and layout is not None:
            x = layout.pad(x)  # [B, T, n_embd]
        return x, head_weight

    def embed(
        self, ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token + position embeddings (with embedding dropout), any leading shape, and the token
        table the tied output layer must use with them."""
        if self.training and self.config.embd_dropout == "matrix" and self.config.embd_pdrop > 0:
            # OAI: dropout on the embedding tables before the gather; the tied output layer of
            # this forward pass sees the same dropped token table.
            wte = self.drop(self.wte.weight)
            return F.embedding(ids, wte) + F.embedding(positions, self.drop(self.wpe.weight)), wte
        return self.drop(self.wte(ids) + self.wpe(positions)), self.wte.weight

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied-head logits: hidden `[..., n_embd]` -> `[..., vocab_size]` (through
        `lm_head_kernel` when one is set)."""
        if self.lm_head_kernel is not None:
            return self.lm_head_kernel.linear(hidden, self.lm_weight(), None)
        return super().lm_logits(hidden)

    # ---------------------------------------------------------------- counts
    def embedding_tables(self) -> tuple[nn.Embedding, ...]:
        """The token and position tables (what `num_parameters(exclude_embeddings=True)` leaves
        out)."""
        return (self.wte, self.wpe)

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token at `seq_len` (default n_positions); see `flops_per_token`."""
        return flops_per_token(self.config, seq_len)


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
