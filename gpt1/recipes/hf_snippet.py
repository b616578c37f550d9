"""The model card's loading code: transformers + the exported head, giving `gpt1 predict`'s output.

`loading_code(record, double_heads, path)` returns Python source that loads a fine-tuned export
and defines `predict(...)`: for classification a dict class name -> probability (the softmax
`gpt1 predict --format jsonl` writes), for regression the score, for multiple choice the list of
answer probabilities. The arguments follow the task's kind: `predict(text)`, `predict(a, b)`,
`predict(context, question, choices)`. tests/test_export.py runs the code as the card prints it.
"""

from __future__ import annotations

from typing import Any

from gpt1.config import TaskKind
from gpt1.tasks.kinds import KINDS

_HEADER = """import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, {cls}

path = {path!r}  # the exported folder
tok = AutoTokenizer.from_pretrained(path)  # use_fast=False: gpt1's exact ids (ftfy + spacy)
start, delimiter, classify = tok.convert_tokens_to_ids(["_start_", "_delimiter_", "_classify_"])
model = {cls}.from_pretrained(path).eval()
"""

# The head beside the LM: the last layer's state at _classify_, then the linear layer.
_BESIDE = """head = load_file(f"{path}/task_head.safetensors")


def state(ids):
    # the last layer's hidden state at the final token, _classify_
    with torch.no_grad():
        return model(torch.tensor([ids])).last_hidden_state[0, -1]


def output(h):
    return h @ head["linear.weight"].T + head["linear.bias"]
"""

# OpenAIGPTDoubleHeadsModel's multiple_choice_head is the trained head itself.
_DOUBLE = """

def score(ids):
    # the head's output for one sequence ending in _classify_
    with torch.no_grad():
        out = model(torch.tensor([[ids]]), mc_token_ids=torch.tensor([[len(ids) - 1]]))
    return float(out.mc_logits[0, 0])
"""

_LABELS = """

labels = [model.config.id2label[i] for i in range(len(model.config.id2label))]
"""

# Similarity: the head reads both orders' states added (the paper's similarity transformation).
_BOTH_ORDERS = """

def predict(a, b):
    # both orders' states are added before the head
    ea, eb = tok.encode(a), tok.encode(b)
    h = state([start] + ea + [delimiter] + eb + [classify])
    h = h + state([start] + eb + [delimiter] + ea + [classify])
"""

_BODIES = {
    (TaskKind.SINGLE, "classes"): """

def predict(text):
    h = state([start] + tok.encode(text) + [classify])
    return dict(zip(labels, output(h).softmax(-1).tolist()))
""",
    (TaskKind.PAIR, "classes"): """

def predict(a, b):
    h = state([start] + tok.encode(a) + [delimiter] + tok.encode(b) + [classify])
    return dict(zip(labels, output(h).softmax(-1).tolist()))
""",
    (TaskKind.SIMILARITY, "classes"): _BOTH_ORDERS
    + """    return dict(zip(labels, output(h).softmax(-1).tolist()))
""",
    (TaskKind.SIMILARITY, "score"): _BOTH_ORDERS
    + """    return float(output(h)[0])
""",
    (TaskKind.SINGLE, "score"): """

def predict(text):
    return score([start] + tok.encode(text) + [classify])
""",
    (TaskKind.PAIR, "score"): """

def predict(a, b):
    return score([start] + tok.encode(a) + [delimiter] + tok.encode(b) + [classify])
""",
    (TaskKind.CHOICE, "choices"): """

def predict(context, question, choices):
    # one sequence per answer: [_start_] context question [_delimiter_] answer [_classify_]
    {question_line}
    scores = [score(first + tok.encode(c) + [classify]) for c in choices]
    return torch.tensor(scores).softmax(-1).tolist()
""",
}

_QUESTION = {
    False: "first = [start] + tok.encode(context) + tok.encode(question) + [delimiter]",
    True: "first = [start] + tok.encode(context) + [delimiter] + tok.encode(question) "
    "+ [delimiter]\n    if not question.strip():\n"
    "        first = [start] + tok.encode(context) + [delimiter]",
}


def output_kind(record: dict[str, Any]) -> str:
    """classes (a softmax over named classes), score (one number) or choices."""
    if KINDS[record["kind"]].choice:
        return "choices"
    return "score" if not record.get("labels") or record["n_outputs"] == 1 else "classes"


def loading_code(record: dict[str, Any], double_heads: bool, path: str) -> str:
    """Python source defining `predict` for the export at `path` (see the module docstring)."""
    kind, out = record["kind"], output_kind(record)
    cls = "OpenAIGPTDoubleHeadsModel" if double_heads else "OpenAIGPTModel"
    code = _HEADER.format(cls=cls, path=path)
    code += _DOUBLE if double_heads else _BESIDE
    if out == "classes":
        code += _LABELS
    body = _BODIES[(kind, out)]
    if out == "choices":
        body = body.format(question_line=_QUESTION[bool(record.get("question_delimiter"))])
    return code + body


def example_call(record: dict[str, Any]) -> str:
    """A call of `predict` for the card, with arguments of the task's kind."""
    return f"print(predict({_EXAMPLE_ARGS[KINDS[record['kind']].roles]}))"


# `predict`'s arguments in the card's example call, by the roles of the task's examples.
_EXAMPLE_ARGS = {
    ("text",): '"a charming and often affecting journey"',
    ("a", "b"): '"A man is playing a guitar.", "A person plays music."',
    ("context", "choices"): '"Tom missed the bus.", "", ["He walked to work.", "He flew home."]',
}
