"""`gpt1 serve`'s OpenAI-compatible endpoints, driven by the clients people point at them.

A real uvicorn server on a loopback port (test_serve's `serving`), the official `openai` SDK and
lm-evaluation-harness's `local-completions` model. Expected values come from gpt1's own
functions in process: `gpt1.recipes.sample.sample` (what `gpt1 sample` prints), the zero-shot
scorer behind `/v1/score`, and the native harness model `gpt1`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from test_serve import TIMEOUT, post, serving, tiny_run  # noqa: E402

from gpt1.config import model_preset  # noqa: E402
from gpt1.inference.sampling import Sampling  # noqa: E402
from gpt1.model.gpt import GPT  # noqa: E402
from gpt1.recipes.finetune import load_tokenizer  # noqa: E402
from gpt1.recipes.sample import sample  # noqa: E402
from helpers.tiny import char_vocab  # noqa: E402

PROMPT = "the old man"


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    """A tiny random GPT with a character vocabulary (no training: greedy paths still differ)."""
    from gpt1.model.checkpoint import save_model

    root = tmp_path_factory.mktemp("openai")
    vocab = char_vocab(root / "vocab")
    torch.manual_seed(1)
    config = model_preset("tiny").derive(vocab_size=load_tokenizer(vocab).vocab_size)
    return save_model(GPT(config), root / "lm", vocab)


@pytest.fixture(scope="module")
def url(lm) -> Iterator[str]:
    """One server for the tests that need no options of their own."""
    with serving(lm) as address:
        yield address


def client(url: str) -> Any:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def test_sdk_models_greedy_stream_stop_and_seeded_choices(lm, url):
    """models.list(); greedy text equals `gpt1 sample --temperature 0` (after the prompt's word
    break), as one response and as stream chunks; several prompts in one call; stop strings cut
    before themselves; n seeded choices are `gpt1 sample --seed s`, `--seed s+1`, ..."""
    greedy = sample(lm, prompt=PROMPT, sampling=Sampling(max_new_tokens=24, temperature=0))[0]
    other = sample(lm, prompt="a", sampling=Sampling(max_new_tokens=24, temperature=0))[0]
    drawn = Sampling(max_new_tokens=12, temperature=0.9, top_k=30, top_p=0.95)
    seeded = [sample(lm, prompt=PROMPT, sampling=replace(drawn, seed=s))[0] for s in (7, 8, 9)]
    api = client(url)
    (model,) = api.models.list().data
    one = api.completions.create(model=model.id, prompt=PROMPT, max_tokens=24, temperature=0)
    chunks = api.completions.create(
        model=model.id, prompt=PROMPT, max_tokens=24, temperature=0, stream=True
    )
    pieces = [(c.choices[0].text, c.choices[0].finish_reason) for c in chunks]
    echoed = api.completions.create(
        model=model.id, prompt=PROMPT, max_tokens=24, temperature=0, stream=True, echo=True
    )
    echoed = [c.choices[0].text for c in echoed]
    both = api.completions.create(
        model=model.id, prompt=[PROMPT, "a"], max_tokens=24, temperature=0
    )
    stop = greedy.text.split()[2]
    stopped = api.completions.create(
        model=model.id, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop, "\u2603"]
    )
    drawn = api.completions.create(
        model=model.id,
        prompt=PROMPT,
        max_tokens=12,
        temperature=0.9,
        top_p=0.95,
        n=3,
        seed=7,
        extra_body={"top_k": 30},
    )
    assert model.object == "model" and model.model_extra["max_model_len"] == 64
    assert one.object == "text_completion" and one.model == model.id
    (choice,) = one.choices
    assert choice.text == " " + greedy.text and choice.finish_reason == "length"
    assert one.usage.completion_tokens == 24 and one.usage.prompt_tokens == greedy.prompt_len
    assert "".join(t for t, _ in pieces) == choice.text and len(pieces) > 10
    assert pieces[-1][1] == "length" and all(f is None for _, f in pieces[:-1])
    assert echoed[0] == PROMPT and "".join(echoed) == PROMPT + choice.text  # the prompt first
    assert [c.text for c in both.choices] == [" " + greedy.text, " " + other.text]
    assert [c.index for c in both.choices] == [0, 1]
    cut = choice.text.index(stop)
    assert stopped.choices[0].text == choice.text[:cut]
    assert stopped.choices[0].finish_reason == "stop"
    assert [c.text for c in drawn.choices] == [" " + s.text for s in seeded]
    assert len({c.text for c in drawn.choices}) > 1


def test_sdk_echo_logprobs_equal_v1_score(lm, url):
    """echo=True, logprobs=1, max_tokens=0 and 1 (lm-evaluation-harness's scoring request):
    each prompt token's log-probability is /v1/score's for that token given the ones before;
    the first is null; the generated token is the greedy one; top_logprobs hold the argmax."""
    tok = load_tokenizer(lm.parent / "vocab")
    ids = tok.encode(PROMPT + " walked")
    greedy = sample(lm, prompt_ids=ids, sampling=Sampling(max_new_tokens=1, temperature=0))[0]
    api = client(url)
    zero = api.completions.create(
        model="lm", prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    one = api.completions.create(
        model="lm", prompt=[ids, ids[:5]], max_tokens=1, echo=True, logprobs=2, temperature=0
    )
    items = [
        {"context_ids": ids[:i], "continuation_ids": ids[i : i + 1]} for i in range(1, len(ids))
    ]
    score = post(f"{url}/v1/score", {"items": items}).json()["results"]
    expected = [r["logprobs"][0] for r in score]
    z = zero.choices[0].logprobs
    assert z.token_logprobs[0] is None and z.top_logprobs[0] is None
    assert z.token_logprobs[1:] == pytest.approx(expected, abs=1e-5)
    assert len(z.tokens) == len(ids) and zero.choices[0].finish_reason == "length"
    assert zero.choices[0].text == tok.decode(ids)
    assert z.text_offset[0] == 0 and z.text_offset == sorted(z.text_offset)
    for lp, top in zip(z.token_logprobs[1:], z.top_logprobs[1:]):
        assert len(top) == 1 and max(top.values()) >= lp
    full, short = one.choices
    f = full.logprobs
    assert f.token_logprobs[1 : len(ids)] == pytest.approx(expected, abs=1e-5)
    assert len(f.tokens) == len(ids) + 1 and len(f.top_logprobs[-1]) == 2
    assert f.token_logprobs[-1] == max(f.top_logprobs[-1].values())  # the greedy token
    assert full.text == tok.decode(ids) + " " + greedy.text
    assert f.tokens[-1].strip() == greedy.text and one.usage.completion_tokens == 2
    assert short.logprobs.token_logprobs[1:5] == pytest.approx(expected[:4], abs=1e-5)


def test_scoring_requests_share_scorer_batches_and_streams_end_with_done(lm):
    """Eight concurrent harness-shaped requests (echo, logprobs 1, max_tokens 1, temperature 0)
    run in fewer scorer batches than requests, with the numbers each gets alone; a raw stream
    is OpenAI's chunks, the usage chunk, then `data: [DONE]`."""
    tok = load_tokenizer(lm.parent / "vocab")
    prompts = [tok.encode(f"the {w} man walked") for w in ("old", "young", "tall", "odd")] * 2
    body = {"max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0, "seed": 1234}
    with serving(lm, batch_wait_ms=500) as url:
        alone = [post(f"{url}/v1/completions", {**body, "prompt": p}).json() for p in prompts[:4]]
        before = batch_counts(url)
        with ThreadPoolExecutor(8) as pool:
            together = list(
                pool.map(lambda p: post(f"{url}/v1/completions", {**body, "prompt": p}), prompts)
            )
        after = batch_counts(url)
        with httpx.stream(
            "POST",
            f"{url}/v1/completions",
            timeout=TIMEOUT,
            json={
                "prompt": PROMPT,
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert after[1] - before[1] == 8 and after[0] - before[0] < 8  # items, batches
    for r, want in zip(together, alone * 2):
        got = r.json()["choices"][0]["logprobs"]
        assert got["token_logprobs"][1:] == pytest.approx(
            want["choices"][0]["logprobs"]["token_logprobs"][1:], abs=1e-5
        )
        assert got["tokens"] == want["choices"][0]["logprobs"]["tokens"]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def batch_counts(url: str) -> tuple[float, float]:
    """(batches, items) the scorer ran for the OpenAI endpoints, from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    values = dict(
        line.rsplit(" ", 1)
        for line in text.splitlines()
        if line.startswith("gpt1_batch_items_") and 'kind="sequence_logprobs"' in line
    )
    count = sum(float(v) for k, v in values.items() if k.startswith("gpt1_batch_items_count"))
    total = sum(float(v) for k, v in values.items() if k.startswith("gpt1_batch_items_sum"))
    return count, total


REFUSED = [
    ({"presence_penalty": 0.5}, 422, "presence_penalty"),
    ({"frequency_penalty": -1}, 422, "frequency_penalty"),
    ({"best_of": 2}, 422, "best_of"),
    ({"logit_bias": {"5": 10}}, 422, "logit_bias"),
    ({"suffix": " the end"}, 422, "suffix"),
    ({"logprobs": 6}, 422, "logprobs"),
    ({"max_tokens": 0}, 422, "max_tokens"),
    ({"temprature": 0}, 422, "temprature"),  # a typo is not ignored
    ({"prompt": "x " * 60}, 422, "window"),  # 60 tokens + 16: over the 64-token window
    ({"prompt": [[1, 2], []]}, 422, "prompt"),
    ({"prompt": [5, 99999]}, 422, "vocabulary"),
    ({"model": "gpt2"}, 404, "'gpt2' is not served"),
]


def test_refusals_are_one_line_and_name_the_field(lm, url):
    """Each refused request: the status, one line naming the field, through the SDK too."""
    api = client(url)
    for fields, status, says in REFUSED:
        r = post(f"{url}/v1/completions", {"prompt": PROMPT, **fields})
        assert r.status_code == status, (fields, r.text)
        message = r.json()["error"]["message"]
        assert says in message and "\n" not in message, fields
        with pytest.raises(openai.APIStatusError, match=says):
            api.completions.create(model="lm", prompt=PROMPT, extra_body=fields)


def test_inert_fields_chat_refusal_and_tokenizer_info(lm, url):
    """`user` changes nothing; /v1/chat/completions says GPT-1 has no chat format; the
    tokenizer info has no end-of-text token and `<unk>` (id 0) as the start token."""
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    plain = post(f"{url}/v1/completions", body).json()
    with_user = post(f"{url}/v1/completions", {**body, "user": "u1", "seed": 3}).json()
    chat = post(f"{url}/v1/chat/completions", {"model": "lm", "messages": []})
    info = httpx.get(f"{url}/tokenizer_info", timeout=TIMEOUT).json()
    bos = post(f"{url}/tokenize", {"prompt": info["bos_token"]}).json()["tokens"]
    with pytest.raises(openai.NotFoundError, match="no chat format"):
        client(url).chat.completions.create(
            model="lm", messages=[{"role": "user", "content": "hi"}]
        )
    assert plain["choices"][0]["text"] == with_user["choices"][0]["text"]
    assert chat.status_code == 404 and "no chat format" in chat.json()["error"]["message"]
    # no end-of-text token; the start token the harness uses is the native adapter's <unk>
    assert info["eos_token"] is None and info["bos_token"] == "<unk>" and bos == [0]


def test_tokenizer_endpoints_and_a_classifier_keeps_predict(tmp_path):
    """/tokenize gives the tokenizer's ids, /detokenize its text; a fine-tuned run keeps
    /v1/predict and serves its language model on /v1/completions (numbers equal /v1/score)."""
    vocab = char_vocab(tmp_path / "vocab")
    run = tiny_run(tmp_path / "run", vocab, "sst2")
    tok = load_tokenizer(vocab)
    text = "a gripping , funny film ."
    ids = tok.encode(text)
    with serving(run) as url:
        info = httpx.get(f"{url}/tokenizer_info", timeout=TIMEOUT).json()
        models = httpx.get(f"{url}/v1/models", timeout=TIMEOUT).json()
        tokens = post(f"{url}/tokenize", {"prompt": text, "add_special_tokens": False}).json()
        back = post(f"{url}/detokenize", {"tokens": ids}).json()
        predicted = post(f"{url}/v1/predict", {"inputs": {"text": text}})
        echo = post(
            f"{url}/v1/completions",
            {"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0},
        ).json()
        score = post(
            f"{url}/v1/score", {"items": [{"context_ids": ids[:1], "continuation_ids": ids[1:]}]}
        ).json()["results"][0]
    assert tokens["tokens"] == ids and tokens["count"] == len(ids)
    assert back["prompt"] == tok.decode(ids)
    assert "eos_token" in info and info["eos_token"] is None and info["bos_token"] is None
    assert info["model_max_length"] == models["data"][0]["max_model_len"] < 64  # its window
    assert predicted.status_code == 200 and predicted.json()["predictions"][0]["label"] in "01"
    lps = echo["choices"][0]["logprobs"]["token_logprobs"]
    assert lps[0] is None and lps[1:] == pytest.approx(score["logprobs"], abs=1e-5)
    assert echo["choices"][0]["logprobs"]["top_logprobs"][1] == {}


# ------------------------------------------------------------------ lm-evaluation-harness
HARNESS_TASKS = ["gpt1_lambada", "gpt1_sst2"]


@pytest.fixture(scope="module")
def gpt1_vocab_checkpoint(tmp_path_factory) -> Path:
    """A tiny GPT with GPT-1's vocabulary and 512 positions (no passage is cut), weights wide
    enough that greedy predictions are not flat."""
    from conftest import SHARED_DATA

    from gpt1.config import ModelConfig
    from gpt1.model.checkpoint import save_model

    vocab = SHARED_DATA / "gpt1_tokenizer"
    if not vocab.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set GPT1_SHARED_DATA)")
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40478, n_positions=512, n_embd=32, n_layer=2, n_head=2))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    return save_model(model, tmp_path_factory.mktemp("harness") / "ck", tokenizer_dir=vocab)


def harness_run(model: str, model_args: dict, data: Path, limit: int) -> dict:
    import lm_eval.models.openai_completions  # noqa: F401  (registers local-completions)

    from gpt1.lm_eval.adapter import register
    from gpt1.recipes.harness import evaluate_with_local_tasks

    register()
    return evaluate_with_local_tasks(
        model, HARNESS_TASKS, data, model_args=model_args, limit=limit, log_samples=True
    )


def per_request(results: dict, task: str) -> list[tuple[float, bool]]:
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    return [tuple(r[0]) for s in samples for r in s["resps"]]


@pytest.mark.slow
def test_local_completions_equals_the_native_harness_model(gpt1_vocab_checkpoint, shared_data):
    """lm-evaluation-harness's `local-completions` with only base_url, model and max_length (its
    tokenizer is the server's, through /tokenizer_info and /tokenize): every request's
    log-likelihood equals the native `gpt1` model's within 1e-4, the greedy flags and the
    accuracies are equal, on the local LAMBADA and SST-2 tasks."""
    ck = gpt1_vocab_checkpoint
    native = harness_run(
        "gpt1", {"checkpoint": str(ck), "device": "cpu", "precision": "fp32"}, shared_data, 24
    )
    with serving(ck) as url:
        remote = harness_run(
            "local-completions",
            {"base_url": f"{url}/v1/completions", "model": ck.name, "max_length": 512},
            shared_data,
            24,
        )
    for task in HARNESS_TASKS:
        want, got = per_request(native, task), per_request(remote, task)
        assert len(got) == len(want) >= 24
        assert [g for _, g in got] == [g for _, g in want], task
        assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in want], abs=1e-4), task
        assert len({round(ll, 3) for ll, _ in got}) > len(got) // 2  # not one number everywhere
        for metric in ("acc,none", "perplexity,none"):
            if metric in native["results"][task]:
                assert remote["results"][task][metric] == pytest.approx(
                    native["results"][task][metric], rel=1e-6 if metric == "acc,none" else 1e-4
                )


def test_continuation_holds_back_text_a_stop_string_could_still_cut(tmp_path):
    """Streamed pieces never include text a later token could turn into a stop string; with or
    without a stop they join into the final text; tokens past the stop are not kept."""
    from gpt1.serve.openai.text import Continuation, held_back

    tok = load_tokenizer(char_vocab(tmp_path / "vocab"))
    prompt, new = tok.encode("the old"), tok.encode("man walked far")
    whole = Continuation(tok, prompt, [])
    pieces = [whole.push(t) for t in new] + [whole.finish()]
    assert "".join(pieces) == whole.text == " man walked far"  # a new word: its space first
    stopped = Continuation(tok, prompt, ["walked", "\u2603"])
    shown = ""
    for t in new:
        shown += stopped.push(t)
        assert not (shown.endswith("w") or shown.endswith("wa")) or stopped.stopped
        if stopped.stopped:
            break
    shown += stopped.finish()
    assert shown == stopped.text == " man " and stopped.stopped
    assert tok.decode(stopped.kept_tokens()) == "man"  # "walked" is not in the kept tokens
    assert held_back("a wal", ["walked"]) == 3 and held_back("a wax", ["walked"]) == 0


def documented_harness_block(doc: Path) -> str:
    """The bash block of `doc` that runs lm-evaluation-harness against `gpt1 serve`."""
    blocks = doc.read_text(encoding="utf-8").split("```bash\n")[1:]
    (block,) = [code for code in (b.split("```")[0] for b in blocks) if "local-completions" in code]
    return block


def wait_until_the_block_serves(proc, url: str, log: Path, timeout: float = 300) -> None:
    """Wait until the `gpt1 serve` the bash block `proc` (a session leader) started in the
    background answers `url`/health, or the block ends; fail with the block's output (`log`) if
    the server exits first, never starts, or does not answer within `timeout` seconds."""
    import time

    started, seen = time.monotonic(), False
    while proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        alive = serve_in_session(proc.pid)
        seen |= alive
        waited = time.monotonic() - started
        if (seen and not alive) or (not seen and waited > 30) or waited > timeout:
            said = "exited" if seen and not alive else f"did not answer in {waited:.0f} s"
            pytest.fail(f"the block's gpt1 serve {said}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def serve_in_session(session: int) -> bool:
    """Whether a live `gpt1 serve` process belongs to `session` (read from /proc; where there is
    no /proc, assumed: the wait is then bounded by its timeout alone)."""
    if not Path("/proc/self/stat").is_file():
        return True
    for folder in Path("/proc").iterdir():
        try:
            stat = (folder / "stat").read_text() if folder.name.isdigit() else ""
            command = (folder / "cmdline").read_bytes().split(b"\0") if stat else []
        except OSError:  # gone meanwhile
            continue
        fields = stat.rpartition(")")[2].split()  # state, ppid, process group, session, ...
        if (
            fields
            and fields[0] != "Z"
            and int(fields[3]) == session
            and b"serve" in command
            and any(part.endswith(b"gpt1") for part in command)
        ):
            return True
    return False


@pytest.mark.slow
def test_the_documented_local_completions_example_runs_on_the_tours_model(tmp_path, shared_data):
    """docs' lm-eval block (the same in lm-eval.md and serve.md), run as written by bash on a
    model shaped as the tour's (runs/tiny: the tiny preset's 64-token window): `gpt1 serve` in
    the background, the window read from /v1/models, then `lm-eval run` against it; only the
    port is another (a free one, not 8000). Both tasks get their accuracy."""
    import os
    import signal
    import subprocess
    import sys

    from test_serve import free_port

    from gpt1.model.checkpoint import save_model
    from helpers.tiny import ROOT, subprocess_env

    docs = ROOT / "docs" / "commands"
    block = documented_harness_block(docs / "lm-eval.md")
    assert block == documented_harness_block(docs / "serve.md")
    vocab = shared_data / "gpt1_tokenizer"
    torch.manual_seed(0)
    config = model_preset("tiny").derive(vocab_size=load_tokenizer(vocab).vocab_size)
    save_model(GPT(config), tmp_path / "runs" / "tiny" / "final", vocab)
    (tmp_path / "gpt1").mkdir()
    (tmp_path / "gpt1" / "lm_eval_tasks").symlink_to(ROOT / "gpt1" / "lm_eval_tasks")
    (tmp_path / "work").mkdir()
    (tmp_path / "shared").symlink_to(shared_data.parent)  # ../shared/data from work/
    for name in ("runs", "gpt1"):
        (tmp_path / "work" / name).symlink_to(tmp_path / name)
    port, serve = str(free_port()), "gpt1 serve runs/tiny"
    assert serve in block
    env = {**subprocess_env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    log = tmp_path / "out.txt"  # a file, not a pipe: the background server keeps a pipe open
    with log.open("w") as sink:
        proc = subprocess.Popen(
            ["bash", "-ec", block.replace("8000", port).replace(serve, f"{serve} --port {port}")],
            cwd=tmp_path / "work",
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the server started with & goes with the group
        )
        try:
            # the block's `until curl .../health` loop would wait forever for a server that died
            wait_until_the_block_serves(proc, f"http://127.0.0.1:{port}", log)
            try:
                proc.wait(timeout=900)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the documented block ran over 900 s:\n{log.read_text()[-3000:]}")
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the server, still running in the background
            except ProcessLookupError:
                pass
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    assert out.count("CPU threads: ") == 1  # serve says its thread count once, at start
    assert "Left truncating context" not in out  # the result table is not buried in warnings
    table = [line for line in out.splitlines() if line.startswith("|")]
    for task in ("gpt1_lambada", "gpt1_sst2"):
        assert any(task in line and "acc" in line for line in table), out[-3000:]
