"""Heads: the extract position, shared classifier dropout, similarity sum, losses."""

from __future__ import annotations

import pytest
import torch

from gpt1.config import model_preset
from gpt1.model.gpt import GPT
from gpt1.model.heads import FinetuneModel, TaskHead, extract_states, shared_dropout
from gpt1.tasks.transforms import SpecialIds, choice, pad_batch, similarity, single
from gpt1.train.objectives import aux_lm_loss, finetune_loss

CLF = 514
S = SpecialIds(512, 513, CLF)


def tiny(kind: str, n_out: int, seed: int = 0) -> FinetuneModel:
    torch.manual_seed(seed)
    gpt = GPT(model_preset("tiny"))
    assert gpt.add_tokens(3) == [512, 513, 514]
    return FinetuneModel(gpt, kind, n_out, CLF).eval()


def test_extract_reads_first_classify_token():
    hidden = torch.arange(2 * 5 * 1, dtype=torch.float32).view(2, 5, 1)
    ids = torch.tensor([[1, CLF, 2, CLF, 0], [1, 2, 3, 4, CLF]])
    assert extract_states(hidden, ids, CLF).view(-1).tolist() == [1.0, 9.0]
    with pytest.raises(ValueError):
        extract_states(hidden, torch.zeros(2, 5, dtype=torch.long), CLF)


def test_head_reads_the_hidden_state_at_the_extract_position():
    m = tiny("single", 3)
    x, mask = pad_batch([single([5, 6, 7], S, 64)])
    out, _ = m(x, mask)
    hidden = m.gpt(x[:, 0])
    expected = m.head.linear(hidden[0, 4])  # position of _classify_
    torch.testing.assert_close(out[0], expected)
    # Padding after the extract token (causal attention) does not change the output.
    padded = torch.cat([x, torch.zeros(1, 1, 6, dtype=torch.long)], dim=2)
    out2, _ = m(padded, torch.cat([mask, torch.zeros(1, 1, 6)], dim=2))
    torch.testing.assert_close(out, out2)


def test_padded_batch_equals_each_example_alone():
    # The model skips each row's padding; outputs and LM losses are those of the rows alone.
    m = tiny("similarity", 2)
    examples = [
        similarity([5, 6, 7, 8, 9], [10, 11], S, 64),
        similarity([5], [6], S, 64),
        similarity([12, 13], [14, 15, 16], S, 64),
    ]
    out, lm = m(*pad_batch(examples))
    alone = [m(*pad_batch([e])) for e in examples]
    torch.testing.assert_close(out, torch.cat([o for o, _ in alone]))
    torch.testing.assert_close(
        aux_lm_loss(lm), torch.stack([aux_lm_loss(l) for _, l in alone]).mean()
    )


def test_similarity_adds_both_orders():
    m = tiny("similarity", 2)
    x, mask = pad_batch([similarity([5, 6, 7], [8, 9], S, 64)])
    out, lm = m(x, mask)
    h = extract_states(m.gpt(x[0]), x[0], CLF)  # [2, C]: the two orders
    torch.testing.assert_close(out[0], m.head.linear(h[0] + h[1]))
    assert aux_lm_loss(lm).shape == ()


def test_choice_scores_each_answer_and_regression_is_scalar():
    m = tiny("choice", 1)
    x, mask = pad_batch([choice([5, 6], [], [[7], [8, 9], [10]], S, 64)] * 2)
    out, lm = m(x, mask)
    assert out.shape == (2, 3) and aux_lm_loss(lm).shape == ()
    reg = tiny("similarity", 1)
    out, _ = reg(*pad_batch([similarity([5], [6], S, 64)] * 4))
    assert out.shape == (4,)


def test_classifier_dropout_mask_is_shared_across_choices():
    torch.manual_seed(0)
    h = torch.ones(4, 3, 256)
    d = shared_dropout(h, 0.5, training=True)
    assert torch.equal(d[:, 0], d[:, 1]) and torch.equal(d[:, 1], d[:, 2])
    assert not torch.equal(d[0, 0], d[1, 0])  # but differs between examples
    assert set(d.unique().tolist()) == {0.0, 2.0}
    assert torch.equal(shared_dropout(h, 0.5, training=False), h)
    head = TaskHead(256, "choice", 1).train()
    assert head(h).shape == (4, 3)


def test_head_init_is_n_0_002():
    head = TaskHead(512, "single", 64)
    assert head.linear.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert head.linear.bias.abs().sum() == 0


def test_lm_loss_ignores_pads_and_is_a_mean_over_sequences():
    m = tiny("single", 2)
    short, long = single([5, 6, 7], S, 64), single([5, 6, 7, 8, 9, 10], S, 64)
    lm, lm_short, lm_long = (
        aux_lm_loss(m(*pad_batch(rows))[1]) for rows in ([short, long], [short], [long])
    )
    # Each sequence counts once whatever its length, and the short one's pads do not count.
    torch.testing.assert_close(lm, (lm_short + lm_long) / 2)
    assert lm.shape == ()


def test_finetune_loss_combines_task_and_lm():
    out = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    lm = torch.tensor([1.0, 3.0])
    labels = torch.tensor([0, 1])
    task = torch.nn.functional.cross_entropy(out, labels)
    loss, logs = finetune_loss(out, lm, labels, regression=False, lm_coef=0.5)
    torch.testing.assert_close(loss, task + 0.5 * 2.0)
    assert logs["lm_loss"] == pytest.approx(2.0)
    loss0, logs0 = finetune_loss(out, lm, labels, regression=False, lm_coef=0.0)
    torch.testing.assert_close(loss0, task) and "lm_loss" not in logs0
    mse, _ = finetune_loss(torch.tensor([1.0, 2.0]), None, torch.tensor([1.5, 2.0]), True, 0.5)
    assert mse.item() == pytest.approx(0.125)


def test_the_lm_loss_is_computed_outside_forward_from_its_outputs():
    # FinetuneModel.forward returns what the loss needs; the loss equals the plain formula.
    from gpt1.train.objectives import lm_loss_per_sequence

    m = tiny("pair", 3)
    x, mask = pad_batch([single([5, 6, 7], S, 64), single([5, 6, 7, 8, 9], S, 64)])
    out, lm = m(x, mask)
    assert m(x, mask, with_lm=False)[1] is None
    plain = lm_loss_per_sequence(m.gpt, m.gpt(x.flatten(0, 1)), x.flatten(0, 1), mask.flatten(0, 1))
    torch.testing.assert_close(aux_lm_loss(lm), plain.mean())


def test_gradients_reach_task_tokens_and_head():
    m = tiny("pair", 3).train()
    x, mask = pad_batch([[[512, 5, 513, 6, 514]]] * 2)
    out, lm = m(x, mask)
    loss, _ = finetune_loss(out, lm, torch.tensor([0, 2]), False, 0.5)
    loss.backward()
    assert m.head.linear.weight.grad.abs().sum() > 0
    assert m.gpt.wte.weight.grad[512:515].abs().sum() > 0
