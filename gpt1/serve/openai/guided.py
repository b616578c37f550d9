"""`guided_choice` (vLLM's extension of `/v1/completions`): the answer is the listed string with
the highest log-likelihood after the prompt.

Each choice is scored as the zero-shot heuristics (`gpt1 zeroshot`) and lm-evaluation-harness
score a continuation: the prompt and the choice tokenized separately, the choice's tokens'
log-probabilities given the prompt summed, by the zero-shot `Scorer` (one "score" job for the
batcher, the path `/v1/score` takes; a prompt that does not fit beside a choice keeps its last
tokens). The choice's text is the answer; every choice's numbers come with it, so a client can
also decide by the mean, as the heuristics for RACE and Story Cloze do.
"""

from __future__ import annotations

from typing import Any

from gpt1.serve.openai.errors import Refused
from gpt1.serve.openai.schemas import CompletionRequest
from gpt1.serve.state import ServeState

# Fields that change what a sampled completion is; a guided choice is scored, not sampled, so
# asking for any of these with it is refused rather than silently ignored.
NOT_WITH = {"stream": False, "echo": False, "logprobs": None, "n": 1, "stop": None}


def check(body: CompletionRequest) -> None:
    """Refuse, naming the field, what a scored choice cannot honour."""
    for name, default in NOT_WITH.items():
        if getattr(body, name) != default:
            raise Refused(
                422,
                f"{name}: not with guided_choice (the answer is scored, not generated); "
                "leave it out",
                name,
            )


async def guided_choices(
    serve: ServeState, body: CompletionRequest, prompts: list[list[int]]
) -> list[dict[str, Any]]:
    """One OpenAI choice per prompt: `text` the likeliest of `body.guided_choice`, and
    `guided_choice`, each string's `logprob` (summed), `mean` and `tokens`."""
    engine, options = serve.engine, list(body.guided_choice)
    endings = await serve.off_loop(
        lambda: [
            engine.token_ids(text, None, f"guided_choice.{n}") for n, text in enumerate(options)
        ]
    )
    for n, ids in enumerate(endings):
        if not ids:
            raise Refused(
                422, f"guided_choice.{n}: no tokens after tokenization", f"guided_choice.{n}"
            )
        if len(ids) > engine.window:
            raise Refused(
                422,
                f"guided_choice.{n}: {len(ids)} tokens, more than the {engine.window} this "
                "model scores in one window",
                f"guided_choice.{n}",
            )
    if len(prompts) * len(options) > serve.limits.max_items:
        raise Refused(
            422,
            f"guided_choice: {len(prompts)} prompts x {len(options)} guided choices: more "
            f"than {serve.limits.max_items} scored together",
            "guided_choice",
        )
    pairs = [(p, e) for p in prompts for e in endings]
    scores = await serve.run("score", pairs, sum(len(p) + len(e) for p, e in pairs))
    out = []
    for i in range(len(prompts)):
        mine = scores[i * len(options) : (i + 1) * len(options)]
        best = max(range(len(options)), key=lambda k: mine[k]["total"])  # the first on a tie
        numbers = [
            {"text": t, "logprob": s["total"], "mean": s["mean"], "tokens": s["tokens"]}
            for t, s in zip(options, mine)
        ]
        out.append(
            {
                "index": i,
                "text": options[best],
                "logprobs": None,
                "finish_reason": "stop",
                "guided_choice": numbers,
            }
        )
    return out
