"""One window per checkpoint: every command that reports or enforces how many tokens a model reads
agrees with `trained_context`, for a pretrained run (run.json's data.n_ctx), a fine-tuned run
(task.json's n_ctx) and a model converted to transformers' format and back (model_max_length).

Each of the three is a tiny 64-position model trained on 32-token windows, so a surface that
falls back to n_positions shows 64 and fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

from test_serve import TIMEOUT, post, serving  # noqa: E402

from gpt1.checkpoint_files import trained_context  # noqa: E402
from gpt1.inference.loading import load_for_inference  # noqa: E402
from helpers.tiny import make_corpus, run_cli, tiny_finetuned_run, tiny_pretrain  # noqa: E402

WINDOW, N_POSITIONS = 32, 64  # the tiny preset's data.n_ctx and n_positions


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("window")
    code, err = run_cli(tiny_pretrain(make_corpus(work / "data"), work / "pre", 1))
    assert code == 0, err
    finetuned, _ = tiny_finetuned_run(work)
    hf, back = work / "pre-hf", work / "pre-back"
    assert run_cli(["convert", str(work / "pre"), str(hf), "--from", "gpt1", "--to", "hf"])[0] == 0
    assert run_cli(["convert", str(hf), str(back), "--from", "hf"])[0] == 0
    return {"pretrained": work / "pre", "finetuned": finetuned, "converted": back}


@pytest.mark.parametrize("kind", ["pretrained", "finetuned", "converted"])
def test_every_surface_reports_and_keeps_the_trained_window(models, kind, tmp_path):
    model = models[kind]
    loaded = load_for_inference(model, "cpu", "fp32")
    assert loaded.lm.config.n_positions == N_POSITIONS
    assert trained_context(model) == loaded.window == WINDOW

    with serving(model) as url:
        listed = httpx.get(f"{url}/v1/models", timeout=TIMEOUT).json()["data"][0]
        health = httpx.get(f"{url}/health", timeout=TIMEOUT).json()
        info = httpx.get(f"{url}/tokenizer_info", timeout=TIMEOUT).json()
        ids = [5, 6, 7]
        fits = {"model": listed["id"], "prompt": ids, "max_tokens": WINDOW - 3, "temperature": 0}
        inside = post(f"{url}/v1/completions", fits)
        outside = post(f"{url}/v1/completions", {**fits, "max_tokens": WINDOW - 2})
        native = [
            post(f"{url}/v1/generate", {"prompt_ids": [5] * n, "max_new_tokens": 1})
            for n in (WINDOW, WINDOW + 1)
        ]
    assert [r.status_code for r in native] == [200, 422], native[1].text
    assert f"{WINDOW}-token window" in native[1].json()["error"]
    assert listed["max_model_len"] == health["window"] == info["model_max_length"] == WINDOW
    assert inside.status_code == 200, inside.text
    assert outside.status_code in (400, 422), outside.text
    assert f"{WINDOW}-token window" in outside.json()["error"]["message"]

    sample = ["sample", str(model), "--prompt-ids", "5 6 7", "--temperature", "0"]
    code, err = run_cli([*sample, "--max-new-tokens", str(WINDOW - 3)])
    assert code == 0 and "window" not in err, err
    code, err = run_cli([*sample, "--max-new-tokens", "50"])
    assert code == 0 and f"past the {WINDOW}-token window" in err, err

    hf = tmp_path / "hf"
    assert run_cli(["convert", str(model), str(hf), "--from", "gpt1", "--to", "hf"])[0] == 0
    assert json.loads((hf / "tokenizer_config.json").read_text())["model_max_length"] == WINDOW

    lm_eval = pytest.importorskip("gpt1.lm_eval.adapter")
    harness = lm_eval.Gpt1LM(checkpoint=str(model), device="cpu", precision="fp32")
    assert harness.max_length == WINDOW
