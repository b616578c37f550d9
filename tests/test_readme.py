"""The README's "Use it from Python" section runs as written: its code block is taken from
README.md and executed against a tiny checkpoint with a character vocabulary, with only the
folder names (and the number of fine-tuning updates) swapped for the test's own."""

from __future__ import annotations

import json
import re

from conftest import ROOT, tiny_model_config

from gpt1.inference.sampling import Sampling
from gpt1.model.checkpoint import save_model
from gpt1.model.gpt import GPT
from helpers.tiny import char_vocab, make_task

SECTION = "## Use it from Python"


def python_blocks(readme: str, heading: str) -> list[str]:
    """The ```python blocks under `heading`, up to the next `## ` heading."""
    start = readme.index(heading + "\n")
    end = readme.find("\n## ", start + len(heading))
    body = readme[start : end if end != -1 else None]
    return re.findall(r"```python\n(.*?)```", body, flags=re.DOTALL)


def test_readme_python_section_runs(tmp_path, capsys):
    blocks = python_blocks((ROOT / "README.md").read_text(), SECTION)
    assert len(blocks) == 1, "the section has one python block"
    code = blocks[0]
    vocab = char_vocab(tmp_path / "vocab")
    size = len(json.loads((vocab / "vocab.json").read_text()))
    checkpoint = save_model(GPT(tiny_model_config(vocab_size=size)), tmp_path / "tiny", vocab)
    data, out = make_task(tmp_path / "reviews"), tmp_path / "runs-reviews"
    swaps = {
        "runs/tiny/final": str(checkpoint),
        "data/reviews": str(data),
        "runs/reviews": str(out),
        '"max_steps": 100': '"max_steps": 2, "batch_size": 4, "micro_batch_size": 2',
    }
    for written, used in swaps.items():
        assert written in code, f"the README block no longer mentions {written!r}"
        code = code.replace(written, used)

    namespace: dict = {}
    exec(compile(code, "README.md, Use it from Python", "exec"), namespace)

    printed = capsys.readouterr().out.splitlines()
    sampler, prompt = namespace["sampler"], namespace["prompt"]
    again = sampler.draw(prompt, Sampling(max_new_tokens=20, top_k=40, seed=1), num_samples=3)
    assert printed[:3] == [repr(sample.text) for sample in again]  # the seed reproduces them
    assert re.fullmatch(r"great -?\d+\.\d\d  awful -?\d+\.\d\d", printed[3])
    results = json.loads((out / "results.json").read_text())
    assert namespace["results"] == results and "accuracy" in results
    assert printed[-1] == str(results)
    assert (out / "final" / "model.safetensors").is_file()


def test_what_the_readme_examples_write_is_ignored_by_git():
    """Run from the repository root, the README's commands and Python example leave `git status`
    clean: every `--out` folder, the Python example's data folder and `gpt1 plot`'s comparison
    figure (compare-METRIC.png in the current folder) are ignored."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    readme = (ROOT / "README.md").read_text()
    outs = set(re.findall(r"--out (runs/\S+)", readme))
    assert {"runs/tiny", "runs/sst2"} <= outs
    metrics = re.findall(r"gpt1 plot runs/a runs/b --metric (\w+)", readme)
    assert metrics == ["val_loss"]
    written = [
        *(f"{out}/final/model.safetensors" for out in outs),
        "data/reviews/train.tsv",  # the Python example's data (the user's own file)
        "runs/reviews/results.json",
        *(f"compare-{m}.png" for m in metrics),
        "runs/mini/loss.png",
    ]
    kept = subprocess.run(
        ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *written],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert [line.split("\t")[1] for line in kept if line.startswith("::")] == []


def test_make_says_what_it_installs_before_each_pip_step(tmp_path):
    """`make demo` / `make test` on a clean clone: each install step is announced (what, and that
    it takes a minute or two) and pip shows its progress instead of running silently."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("make") is None:
        pytest.skip("no make")
    plan = subprocess.run(
        ["make", "-n", "-B", "test", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    installs = [i for i, line in enumerate(plan) if "pip install" in line]
    assert len(installs) == 3  # torch, the package, the dev extras
    for i in installs:
        assert "--quiet" not in plan[i] and "--progress-bar on" in plan[i]
        assert plan[i - 1].startswith("echo") and "a minute or two" in plan[i - 1], plan[i - 1]
