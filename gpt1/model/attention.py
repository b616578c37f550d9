"""Attention: every attention the model computes in torch goes through `attention()`.

`attention(q, k, v, attn_mask, dropout_p, is_causal)` is a drop-in for
`F.scaled_dot_product_attention`. The model's full causal pass (`gpt1.model.gpt`), its passes over
part of a batch (`gpt1.model.layouts`: right-padded rows, one query per row) and incremental
decoding over key/value caches (`gpt1.inference.decoding`) all call it, so a change to how attention
is computed (a kernel, a CPU fast path, dropout) reaches every one of them. The one exception is
inference's compiled decoding step (`gpt1.inference.block_step`), which computes a new token's
attention over its cache in C++ and is tested against these passes. On the CPU, causal
attention with dropout is written out (`gpt1.model.fast_cpu.causal_attention_cpu_train`: SDPA has
no fused CPU kernel with dropout); everything else is torch's SDPA.

`split_heads` and `merge_heads` are the shapes around it: GPT-1's fused `c_attn` output
`[B, T, 3C]` in q | k | v order (as in OAI's code) to three `[B, H, T, D]` tensors, and back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt1.model.fast_cpu import causal_attention_cpu_train


def split_heads(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[B, T, 3C]` -> q, k, v, each `[B, H, T, D]` (views of `qkv`)."""
    B, T, three_c = qkv.shape
    # [B, T, 3C] -> [B, T, 3, H, D] -> [3, B, H, T, D]
    q, k, v = qkv.view(B, T, 3, n_head, three_c // (3 * n_head)).permute(2, 0, 3, 1, 4)
    return q, k, v


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """`[B, H, T, D]` -> `[B, T, H * D]`."""
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, H * D)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)`: q `[B, H, Tq,
    D]`, k and v `[B, H, Tk, D]` -> `[B, H, Tq, D]`; causal attention with dropout on the CPU is
    written out (same maths and distribution, less memory kept for backward)."""
    if is_causal and attn_mask is None and dropout_p > 0 and q.device.type == "cpu":
        return causal_attention_cpu_train(q, k, v, dropout_p)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
    )
