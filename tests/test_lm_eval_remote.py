"""lm-evaluation-harness's `local-completions` with `tokenizer_backend=auto` and no tokenizer of
its own, against `gpt1 serve`: it detects the server's tokenizer (`/tokenizer_info`,
`/tokenize`), its `RemoteTokenizer` encodes and decodes (`/detokenize`) as gpt1's tokenizer
does, and every log-likelihood equals the native `gpt1` harness model's within 1e-4.

GPT-1's real vocabulary (shared data) on a tiny random model: test_serve_openai's checkpoint
and harness helpers.
"""

from __future__ import annotations

import re

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("lm_eval")

from test_serve import TIMEOUT, serving  # noqa: E402
from test_serve_openai import (  # noqa: E402, F401  (gpt1_vocab_checkpoint: a fixture)
    HARNESS_TASKS,
    gpt1_vocab_checkpoint,
    harness_run,
    per_request,
)

from gpt1.checkpoint_files import open_checkpoint  # noqa: E402
from gpt1.text.tokenizer import Tokenizer  # noqa: E402

TEXTS = ["The old man walked away , slowly .", "it 's a mess", "does n't 3.5 e.g. naïve"]


def requests_to(url: str, endpoint: str) -> float:
    """Requests the server answered 200 on `endpoint` (its `/metrics`)."""
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    pattern = rf'^gpt1_requests_total\{{code="200",endpoint="{re.escape(endpoint)}"\}} (\S+)$'
    found = re.search(pattern, text, re.M)
    if found is None:  # label order is prometheus_client's; accept either
        pattern = rf'^gpt1_requests_total\{{endpoint="{re.escape(endpoint)}",code="200"\}} (\S+)$'
        found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.slow
def test_auto_detects_the_remote_tokenizer_and_equals_the_native_model(
    gpt1_vocab_checkpoint,  # noqa: F811  (the fixture imported above)
    shared_data,
):
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.utils import RemoteTokenizer

    ck = gpt1_vocab_checkpoint
    tok = Tokenizer.from_dir(open_checkpoint(ck).tokenizer_dir)
    native = harness_run(
        "gpt1", {"checkpoint": str(ck), "device": "cpu", "precision": "fp32"}, shared_data, 16
    )
    with serving(ck) as url:
        base = f"{url}/v1/completions"
        model = LocalCompletionsAPI(
            base_url=base, model=ck.name, tokenizer_backend="auto", max_length=512
        )
        encoded = [model.tok_encode(t) for t in TEXTS]
        decoded = [model.tokenizer.decode(ids) for ids in encoded]
        used = {e: requests_to(url, e) for e in ("/tokenizer_info", "/tokenize", "/detokenize")}
        remote = harness_run(
            "local-completions",
            {"base_url": base, "model": ck.name, "max_length": 512, "tokenizer_backend": "auto"},
            shared_data,
            16,
        )
        after = requests_to(url, "/tokenize")
    assert model.tokenizer_backend == "remote" and isinstance(model.tokenizer, RemoteTokenizer)
    assert encoded == [tok.encode(t) for t in TEXTS]
    assert decoded == [tok.decode(tok.encode(t)) for t in TEXTS]
    assert all(n > 0 for n in used.values()), used
    assert after > used["/tokenize"]  # the harness run tokenized through the server too
    for task in HARNESS_TASKS:
        want, got = per_request(native, task), per_request(remote, task)
        assert len(got) == len(want) >= 16
        assert [g for _, g in got] == [g for _, g in want], task
        assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in want], abs=1e-4), task
