"""Two processes (torchrun, gloo on CPU) follow the one-process loss trajectory at the same global
batch, and only rank 0 writes files."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from test_pretrain import env, make_prepared, train_losses

NO_DROPOUT = ["--set", "model.embd_pdrop=0", "--set", "model.attn_pdrop=0",
              "--set", "model.resid_pdrop=0"]


def cmd(launcher: list[str], data, out, *extra: str) -> list[str]:
    return [*launcher, "-m", "gpt1", "--quiet", "pretrain", "--preset", "tiny", "--data", str(data),
            "--out", str(out), "--max-steps", "6", "--batch-size", "4", "--micro-batch", "2",
            "--save-every", "3", "--eval-every", "3", "--set", "train.peak_flops=1", *NO_DROPOUT,
            *extra]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    data = make_prepared(tmp_path / "data")
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run(cmd([sys.executable], data, one), check=True, env=env(), capture_output=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    res = subprocess.run(cmd(torchrun, data, two), env=env(), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]

    l1, l2 = train_losses(one), train_losses(two)
    assert [s for s, _ in l1] == [s for s, _ in l2] == list(range(1, 7))   # one line per step
    np.testing.assert_allclose([v for _, v in l2], [v for _, v in l1], rtol=2e-5)
    vals = lambda run: [json.loads(l)["val_loss"] for l in (run / "metrics.jsonl").read_text()
                        .splitlines() if "val_loss" in l]
    np.testing.assert_allclose(vals(two), vals(one), rtol=2e-5)
    a = load_file(str(one / "final" / "model.safetensors"))
    b = load_file(str(two / "final" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    # only rank 0 wrote: same files, no leftovers; both ranks' cursors and RNG are in the state
    names = lambda run: sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    assert names(two) == names(one)
    state = json.loads((two / "step-6" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and len(state["sources"]) == 2
