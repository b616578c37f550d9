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

from gpt1.testing.fault_cases import child_pids

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


@pytest.mark.slow
def test_second_torchrun_launch_on_a_held_run_is_refused(tmp_path):
    """The run lock under torchrun: rank 0 of a running launch holds the folder; a second launch
    on it is refused with gpt1's one-line error naming the holder, torchrun stops the second
    launch's other rank (no hang in rendezvous), and the first run's metrics stay single."""
    import contextlib
    import os
    import signal
    import time
    data = make_prepared(tmp_path / "data")
    run = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    argv = cmd(torchrun, data, run, "--log-every", "1", "--resume", "auto")
    argv[argv.index("--max-steps") + 1] = "1000000"     # runs until stopped below
    argv[argv.index("--save-every") + 1] = "1000"
    argv[argv.index("--eval-every") + 1] = "0"
    # A session of its own, so that a failing test can stop torchrun's workers too.
    first = subprocess.Popen(argv, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        logged = lambda: ((run / "metrics.jsonl").read_text().count('"loss"')
                          if (run / "metrics.jsonl").is_file() else 0)
        deadline = time.time() + 300
        while logged() < 2 and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert logged() >= 2, "the first launch never logged a step"
        second = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=240,
                                start_new_session=True)
        assert second.returncode != 0
        refusals = [line for line in second.stderr.splitlines() if "gpt1 pretrain: error:" in line]
        assert len(refusals) == 1, second.stderr[-3000:]
        assert "in use by another gpt1 process" in refusals[0] and "since 20" in refusals[0]
        holder = int(refusals[0].split("(pid ", 1)[1].split()[0])
        assert holder in child_pids(first.pid)      # rank 0 of the first launch holds the lock
        assert first.poll() is None, "the first launch died while the second was refused"
    finally:
        ranks = child_pids(first.pid)    # torchrun starts its workers in sessions of their own
        first.send_signal(signal.SIGTERM)          # torchrun passes it on to its ranks
        try:
            first.wait(timeout=60)
        finally:
            for pid in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            first.kill()
            first.wait()
            first.stderr.close()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines[:-1] if '"loss"' in line]
    assert steps == list(range(1, len(steps) + 1))   # each step once: the second launch wrote nothing
