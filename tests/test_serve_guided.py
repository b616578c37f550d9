"""`guided_choice` on `/v1/completions` against `gpt1 zeroshot`: on every example of two of the
paper's zero-shot tasks (SST-2 and Story Cloze, small files written here) the server's
per-choice log-likelihoods equal the heuristics' own scores within 1e-5 and its answers give the
accuracy `gpt1 zeroshot` reports. A tiny random GPT with a character vocabulary; a real uvicorn
server (test_serve's `serving`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from test_serve import SENTENCES, TIMEOUT, post, serving, tiny_lm  # noqa: E402

from gpt1.checkpoint_files import open_checkpoint  # noqa: E402
from gpt1.cli import main  # noqa: E402
from gpt1.inference.scoring import Scorer  # noqa: E402
from gpt1.model.checkpoint import load_model  # noqa: E402
from gpt1.tasks.registry import get_task  # noqa: E402
from gpt1.text.tokenizer import Tokenizer  # noqa: E402
from gpt1.zeroshot.heuristics import _candidate_scores  # noqa: E402
from helpers.tiny import char_vocab  # noqa: E402

WORDS = ["negative", "positive"]  # zs_sst2's candidates, index = label


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Any]:
    """A tiny LM, an SST-2 dev file and a Story Cloze test file (all labelled)."""
    root = tmp_path_factory.mktemp("guided")
    lm = tiny_lm(root / "lm", char_vocab(root / "vocab"), n_positions=256)
    sst2 = root / "SST-2"
    sst2.mkdir()
    rows = [f"{s}\t{i % 2}" for i, s in enumerate(SENTENCES * 3)]
    (sst2 / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    cloze = root / "story_cloze"
    cloze.mkdir()
    columns = ["InputStoryid"] + [f"InputSentence{i}" for i in range(1, 5)]
    columns += ["RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2", "AnswerRightEnding"]
    with open(cloze / "tiny_test.csv", "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(columns)
        for i in range(12):
            s = [SENTENCES[(i + k) % len(SENTENCES)] for k in range(6)]
            out.writerow([f"s{i}", *s, str(1 + i % 2)])
    return {"root": root, "lm": lm, "sst2": sst2, "cloze": cloze}


def zeroshot_accuracy(setup: dict[str, Any], task: str, data: Path) -> float:
    out = setup["root"] / f"zs-{task}"
    argv = ["--quiet", "zeroshot", str(setup["lm"]), "--task", task, "--data", str(data)]
    assert main([*argv, "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())["tasks"][task]["value"]


def heuristic_scorer(lm: Path) -> tuple[Scorer, Tokenizer]:
    """The scorer and tokenizer `gpt1 zeroshot` builds for a checkpoint."""
    checkpoint = open_checkpoint(lm)
    model = load_model(checkpoint, device="cpu").eval()
    scorer = Scorer(model, max_context=checkpoint.trained_context)
    return scorer, Tokenizer.from_dir(checkpoint.tokenizer_dir)


def guided(url: str, prompt: Any, choices: list[str]) -> list[dict[str, Any]]:
    r = post(f"{url}/v1/completions", {"prompt": prompt, "guided_choice": choices})
    assert r.status_code == 200, r.text
    return r.json()["choices"]


def test_guided_choice_equals_gpt1_zeroshot_on_sst2_and_story_cloze(setup):
    scorer, tok = heuristic_scorer(setup["lm"])
    sst2 = get_task("sst2").read(setup["sst2"], "dev").examples
    cloze = get_task("story_cloze").read(setup["cloze"], "test").examples
    # The heuristics' own numbers: summed log-probabilities of the two words after
    # "<sentence> very" (SST-2), mean log-probability of each ending after the story (Story Cloze).
    contexts = [tok.encode(e.text + " very") for e in sst2]
    sst2_expected = _candidate_scores(
        scorer, contexts, [[tok.encode(w) for w in WORDS]] * len(sst2), "sum"
    )
    cloze_expected = _candidate_scores(
        scorer,
        [tok.encode(e.context) for e in cloze],
        [[tok.encode(c) for c in e.choices] for e in cloze],
        "mean",
    )
    with serving(setup["lm"]) as url:
        # Several prompts with the same choices in one request (SST-2), one request each
        # (Story Cloze: each story has its own endings).
        half = len(sst2) // 2
        sst2_answers = [
            c
            for part in (sst2[:half], sst2[half:])
            for c in guided(url, [e.text + " very" for e in part], WORDS)
        ]
        cloze_answers = [guided(url, e.context, e.choices)[0] for e in cloze]
    sst2_got = np.array([[c["logprob"] for c in a["guided_choice"]] for a in sst2_answers])
    cloze_got = np.array([[c["mean"] for c in a["guided_choice"]] for a in cloze_answers])
    assert np.abs(sst2_got - sst2_expected).max() < 1e-5
    assert np.abs(cloze_got - cloze_expected).max() < 1e-5
    # The answer is the likeliest choice; its accuracy is the one gpt1 zeroshot reports.
    picks = [WORDS.index(a["text"]) for a in sst2_answers]
    assert picks == list(sst2_expected.argmax(1))
    assert [a["index"] for a in sst2_answers] == list(range(half)) + list(range(len(sst2) - half))
    sst2_accuracy = np.mean([p == int(e.label) for p, e in zip(picks, sst2)])
    assert sst2_accuracy == pytest.approx(zeroshot_accuracy(setup, "sst2", setup["sst2"]))
    cloze_picks = cloze_got.argmax(1)
    cloze_accuracy = np.mean([p == int(e.label) for p, e in zip(cloze_picks, cloze)])
    assert cloze_accuracy == pytest.approx(zeroshot_accuracy(setup, "story_cloze", setup["cloze"]))
    for a, e in zip(cloze_answers, cloze):
        sums = [c["logprob"] for c in a["guided_choice"]]
        assert a["text"] == e.choices[int(np.argmax(sums))] and a["finish_reason"] == "stop"
        assert [c["tokens"] for c in a["guided_choice"]] == [len(tok.encode(c)) for c in e.choices]


def test_guided_choice_through_the_sdk_and_its_refusals(setup):
    """The openai SDK sends it as extra_body; what a scored answer cannot honour is refused in
    one line naming the field."""
    with serving(setup["lm"]) as url:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="-", timeout=TIMEOUT, max_retries=0)
        out = api.completions.create(
            model="lm", prompt="the film was", extra_body={"guided_choice": ["good", "bad"]}
        )
        refused = {
            name: post(
                f"{url}/v1/completions",
                {"prompt": "a", "guided_choice": ["b", "c"], name: value},
            )
            for name, value in (("stream", True), ("logprobs", 1), ("n", 2), ("echo", True))
        }
        empty = post(f"{url}/v1/completions", {"prompt": "a", "guided_choice": []})
        too_many = post(f"{url}/v1/completions", {"prompt": "a", "guided_choice": ["b"] * 17})
    (choice,) = out.choices
    numbers = choice.model_extra["guided_choice"]
    assert choice.text in ("good", "bad") and [n["text"] for n in numbers] == ["good", "bad"]
    assert choice.text == max(numbers, key=lambda n: n["logprob"])["text"]
    assert all(n["logprob"] <= 0 and n["tokens"] == len(n["text"]) for n in numbers)
    for name, r in refused.items():
        message = r.json()["error"]["message"]
        assert r.status_code == 422 and message.startswith(f"{name}: not with guided_choice")
    assert empty.status_code == 422 and "guided_choice" in empty.json()["error"]["message"]
    assert too_many.status_code == 422 and "guided_choice" in too_many.json()["error"]["message"]
