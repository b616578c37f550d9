"""The four input transformations: exact token layouts, truncation policy, padding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt1.tasks.examples import ChoiceExample, PairExample, TextExample
from gpt1.tasks.transforms import (
    SpecialIds,
    choice,
    pad_batch,
    pair,
    similarity,
    single,
    transform,
    truncate,
)

S = SpecialIds(start=100, delimiter=101, classify=102)


def test_single_layout():
    assert single([1, 2, 3], S, 16) == [[100, 1, 2, 3, 102]]


def test_pair_layout():
    assert pair([1, 2], [3], S, 16) == [[100, 1, 2, 101, 3, 102]]


def test_similarity_has_both_orders():
    assert similarity([1, 2], [3], S, 16) == [[100, 1, 2, 101, 3, 102], [100, 3, 101, 1, 2, 102]]


def test_choice_one_sequence_per_answer():
    seqs = choice([1, 2], [3], [[4], [5, 6]], S, 16)
    # The paper's [z; q; $; a_k]: context and question concatenated, then the delimiter.
    assert seqs == [[100, 1, 2, 3, 101, 4, 102], [100, 1, 2, 3, 101, 5, 6, 102]]
    assert choice([1, 2], [], [[4]], S, 16) == [[100, 1, 2, 101, 4, 102]]  # Story Cloze
    assert choice([1], [3], [[4]], S, 16, question_delimiter=True) == [
        [100, 1, 101, 3, 101, 4, 102]
    ]


def test_transform_dispatches_on_kind():
    enc = lambda text: [len(w) for w in text.split()]  # noqa: E731  (a stand-in tokenizer)
    assert transform("single", TextExample("ab c"), enc, S, 8) == [[100, 2, 1, 102]]
    assert transform("similarity", PairExample("a", "bb"), enc, S, 8) == [
        [100, 1, 101, 2, 102],
        [100, 2, 101, 1, 102],
    ]
    ex = ChoiceExample("aaa", " ", ["b", "cc"], 1)
    assert transform("choice", ex, enc, S, 8) == [[100, 3, 101, 1, 102], [100, 3, 101, 2, 102]]


def test_truncation_cuts_longest_segment_from_its_end():
    assert truncate([[1, 2, 3, 4, 5, 6], [7, 8]], 5) == [[1, 2, 3], [7, 8]]
    assert truncate([[1, 2, 3], [4, 5, 6]], 4) == [[1, 2], [4, 5]]
    # Ties go to the earlier segment first.
    assert truncate([[1, 2, 3], [4, 5, 6]], 5) == [[1, 2], [4, 5, 6]]
    seqs = similarity(list(range(1, 30)), [50, 51], S, 10)
    assert seqs[0] == [100, 1, 2, 3, 4, 5, 101, 50, 51, 102]
    assert seqs[1] == [100, 50, 51, 101, 1, 2, 3, 4, 5, 102]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 99), max_size=40), min_size=1, max_size=3), st.integers(5, 48)
)
def test_truncation_never_drops_the_extract_token(segments, n_ctx):
    ctx = segments[0]
    answers = segments[1:] or [[]]
    for seq in choice(ctx, [7, 7], answers, S, n_ctx) + single(ctx, S, n_ctx):
        assert len(seq) <= n_ctx
        assert seq[0] == 100 and seq[-1] == 102 and seq.count(102) == 1
    a, b = segments[0], segments[-1]
    for seq in pair(a, b, S, n_ctx):
        assert len(seq) == min(n_ctx, len(a) + len(b) + 3) and seq.count(101) == 1


def test_no_room_for_content_is_an_error():
    with pytest.raises(ValueError):
        pair([1], [2], S, 2)


def test_pad_batch_right_pads_and_masks():
    ids, mask = pad_batch([[[100, 1, 102]], [[100, 1, 2, 3, 102]]])
    assert ids.shape == (2, 1, 5) and ids[0, 0].tolist() == [100, 1, 102, 0, 0]
    assert mask[0, 0].tolist() == [1, 1, 1, 0, 0] and mask[1].sum() == 5
