"""Layouts: passes of the model over part of a batch, each written once, as what attention sees.

Everything in a block but attention is position-wise, so a pass may run the block on any set of
token rows. A layout says which rows those are and what their queries attend to; the block's
maths stays `GPT`'s own (`Block.forward(x, layout)`):

- `attend(qkv, n_head, dropout_p)`: the attention output `[rows, C]` from the fused q|k|v
  projection of the rows the block was given, through the attention function
  (`gpt1.model.attention`);
- `query_rows(x)`: the rows of the block's input that attention answered for (the residual
  stream continues with those);
- `writes_cache`: whether the pass writes a key/value cache, and so must run exactly once
  (activation checkpointing, `gpt1.train.parallelize`, would run it twice).

Two layouts live here, used by `GPT.forward` in training and inference alike: `Unpadded` (the
real tokens of a right-padded batch, `lengths=`) and `AtPositions` (one query per row in the last
block, `at=`). Decoding's layouts (new tokens after a key/value cache, one token of each of many
sequences) live with the caches in `gpt1.inference.decoding`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from gpt1.model.attention import attention, merge_heads, split_heads


class Layout(Protocol):
    """How a block's attention runs on the rows it is given (see the module docstring)."""

    writes_cache: bool

    def attend(self, qkv: torch.Tensor, n_head: int, dropout_p: float) -> torch.Tensor: ...
    def query_rows(self, x: torch.Tensor) -> torch.Tensor: ...


class Unpadded:
    """Where the real tokens of a right-padded `[B, T]` batch sit among its B*T positions.

    The block runs on the real tokens alone (`[N, C]`); attention needs rows, and runs on
    `pad(...)`-ed `[B, T, ...]` tensors whose padding, being after every real token, is never
    attended to by one.
    """

    writes_cache = False

    def __init__(self, lengths: torch.Tensor, T: int):
        self.B, self.T = lengths.shape[0], T
        keep = torch.arange(T, device=lengths.device) < lengths[:, None]  # [B, T]
        self.index = keep.flatten().nonzero().squeeze(1)  # [N] flat positions
        self.rows_cols = (self.index // T, self.index % T)  # [N] row, [N] column

    @classmethod
    def of(cls, ids: torch.Tensor, lengths: torch.Tensor | None) -> Unpadded | None:
        """The layout of ids `[B, T]` whose row b holds `lengths[b]` real tokens, or None where
        there is no padding to skip."""
        if lengths is None:
            return None
        B, T = ids.shape
        lengths = lengths.to(ids.device)
        if lengths.shape != (B,) or bool((lengths < 0).any() | (lengths > T).any()):
            raise ValueError(
                f"lengths must be [B] = [{B}] values in 0..{T}; got shape {list(lengths.shape)}"
            )
        return None if bool((lengths == T).all()) else cls(lengths, T)

    def tokens(self, t: torch.Tensor) -> torch.Tensor:
        """`[B, T]` -> `[N]`, the real positions in row-major order."""
        return t.reshape(self.B * self.T).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """`[N, F]` -> `[B, T, F]`, zeros at padding (a fresh tensor, not a view: FSDP2 warns
        about modules returning views)."""
        full = x.new_zeros(self.B, self.T, x.shape[-1])
        return full.index_put_(self.rows_cols, x)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, T, F]` -> `[N, F]`, the real positions in row-major order."""
        return x.reshape(self.B * self.T, -1).index_select(0, self.index)

    def attend(self, qkv: torch.Tensor, n_head: int, dropout_p: float) -> torch.Tensor:
        q, k, v = split_heads(self.pad(qkv), n_head)  # [N, 3C] -> [B, T, 3C] -> [B, H, T, D]
        y = attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return self.unpad(merge_heads(y))  # [B, H, T, D] -> [B, T, C] -> [N, C]

    def query_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x


class AtPositions:
    """One query per row: the last block's output at `positions[b]` of each row b only, `[B, C]`
    (what a classification head reads), over `[B, T, C]` rows or an `Unpadded` layout's tokens.

    Keys and values still cover every position up to each row's own. In training with attention
    dropout, attention runs at every position (same dropout, same random draws as the full pass)
    and the rows are picked after it; without dropout one query per row suffices. Everything
    after attention runs on B rows instead of every token.
    """

    writes_cache = False

    def __init__(self, positions: torch.Tensor, B: int, T: int, layout: Unpadded | None):
        self.positions, self.layout = positions, layout
        self.rows = torch.arange(B, device=positions.device)
        self.T = T

    @classmethod
    def of(cls, at: torch.Tensor, ids: torch.Tensor, layout: Unpadded | None) -> AtPositions:
        """The layout for positions `at` `[B]` of ids `[B, T]` (checked)."""
        B, T = ids.shape
        at = at.to(ids.device)
        if at.shape != (B,) or bool(((at < 0) | (at >= T)).any()):
            raise ValueError(f"at must be [B] = [{B}] positions in 0..{T - 1}")
        return cls(at, B, T, layout)

    def attend(self, qkv: torch.Tensor, n_head: int, dropout_p: float) -> torch.Tensor:
        if self.layout is not None:
            qkv = self.layout.pad(qkv)  # [N, 3C] -> [B, T, 3C]
        B, C = qkv.shape[0], qkv.shape[-1] // 3
        q, k, v = split_heads(qkv, n_head)  # [B, H, T, D]
        if dropout_p > 0:
            y = attention(q, k, v, dropout_p=dropout_p, is_causal=True)
            y = y[self.rows, :, self.positions]  # [B, H, D]
        else:
            q = q[self.rows, :, self.positions].unsqueeze(2)  # [B, H, 1, D]
            visible = torch.arange(self.T, device=q.device) <= self.positions[:, None]  # [B, T]
            y = attention(q, k, v, attn_mask=visible[:, None, None, :])
        return y.reshape(B, C)

    def query_rows(self, x: torch.Tensor) -> torch.Tensor:
        full = self.layout.pad(x) if self.layout is not None else x  # [B, T, C]
        return full[self.rows, self.positions]  # [B, C]
