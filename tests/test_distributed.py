"""More than one process gives the one-process run: two processes on one machine (torchrun, gloo
on CPU) with DDP and with FSDP2, and two torchrun agents rendezvousing like two machines
(`--nnodes 2`, c10d on 127.0.0.1). Same losses at the same global batch, same weights, same files,
only rank 0 writes; FSDP2 checkpoints resume exactly and fine-tune like DDP."""

from __future__ import annotations

import json
import shlex
import socket
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import subprocess_env
from safetensors.torch import load_file

from helpers import fault_cases
from helpers.tiny import TORCHRUN_TWO_PROCESSES, gpt1_process, tiny_finetune, tiny_pretrain

NO_DROPOUT = [
    "--set",
    "model.embd_pdrop=0",
    "--set",
    "model.attn_pdrop=0",
    "--set",
    "model.resid_pdrop=0",
]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SST2 = ("--task", "sst2")
ROOT = Path(__file__).resolve().parents[1]
SLURM_SCRIPT = ROOT / "scripts" / "cluster" / "pretrain.sbatch"
K8S_JOB = ROOT / "scripts" / "cluster" / "pretrain-k8s.yaml"


def cmd(launcher: list[str], data, out, *extra: str) -> list[str]:
    """The run every test here repeats, under `launcher`: 6 steps of the tiny preset at batch 4
    in micro-batches of 2, a checkpoint and a validation every 3 steps, no dropout."""
    flags = ("--batch-size", "4", "--micro-batch", "2", "--save-every", "3", "--eval-every", "3")
    argv = tiny_pretrain(data, out, 6, *flags, *NO_DROPOUT, *extra)
    return gpt1_process(*argv, launcher=tuple(launcher))


def run(args: list[str]) -> None:
    res = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]


def records(run_dir: Path, key: str) -> list[tuple[int, float]]:
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r[key]) for r in lines if key in r]


def assert_same_run(one: Path, two: Path, trackers: tuple[str, ...] = ()) -> None:
    """`two` (2 processes) followed `one` (1 process): losses, weights, files, per-rank state.
    `trackers`: files that only `two` has (its --logger outputs)."""
    l1, l2 = records(one, "loss"), records(two, "loss")
    assert [s for s, _ in l1] == [s for s, _ in l2] == list(range(1, 7))  # one line per step
    np.testing.assert_allclose([v for _, v in l2], [v for _, v in l1], rtol=2e-5)
    v1, v2 = records(one, "val_loss"), records(two, "val_loss")
    assert len(v1) == len(v2) == 3
    np.testing.assert_allclose([v for _, v in v2], [v for _, v in v1], rtol=2e-5)
    a = load_file(str(one / "final" / "model.safetensors"))
    b = load_file(str(two / "final" / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    # only rank 0 wrote: same files, no leftovers; both ranks' cursors and RNG are in the state
    names = lambda run: sorted(
        str(p.relative_to(run))
        for p in run.rglob("*")
        if p.relative_to(run).parts[0] not in trackers
    )
    assert names(two) == names(one)
    state = json.loads((two / "step-6" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and len(state["sources"]) == 2


@pytest.fixture(scope="module")
def one_process(tiny_corpus: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    run(cmd([sys.executable], tiny_corpus, out))
    return out


@pytest.mark.slow
def test_two_processes_match_one(tiny_corpus, one_process, tmp_path):
    two = tmp_path / "two"
    run(cmd(TORCHRUN_TWO_PROCESSES, tiny_corpus, two))
    assert_same_run(one_process, two)


@pytest.mark.slow
def test_fsdp2_matches_one_process_and_resumes_exactly(tiny_corpus, one_process, tmp_path):
    two, resumed = tmp_path / "fsdp", tmp_path / "resumed"
    launcher = TORCHRUN_TWO_PROCESSES
    run(cmd(launcher, tiny_corpus, two, "--set", "train.distributed=fsdp"))
    assert_same_run(one_process, two)
    # The sharded optimizer state went through a full (unsharded) checkpoint and back; with
    # activation checkpointing on top, steps 4-6 repeat the uninterrupted run.
    run(
        cmd(
            launcher,
            tiny_corpus,
            resumed,
            "--resume",
            str(two / "step-3"),
            "--set",
            "train.distributed=fsdp",
            "--set",
            "train.gradient_checkpointing=true",
        )
    )
    np.testing.assert_allclose(
        [v for _, v in records(resumed, "loss")],
        [v for s, v in records(two, "loss") if s > 3],
        rtol=1e-6,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_torchrun() -> tuple[list[str], list[str]]:
    """The SLURM script's torchrun line as (launcher flags, gpt1 arguments), variables unexpanded."""
    logical = SLURM_SCRIPT.read_text().replace("\\\n", " ").splitlines()
    line = next(l for l in logical if "torchrun" in l and not l.lstrip().startswith("#"))
    argv = shlex.split(line)
    argv = argv[argv.index("torchrun") + 1 :]
    split = argv.index("-m")
    assert argv[split + 1] == "gpt1", argv
    return argv[:split], argv[split + 2 :]


def k8s_torchrun() -> tuple[list[str], list[str]]:
    """The Kubernetes Job's container command, split the same way."""
    import yaml

    job = next(d for d in yaml.safe_load_all(K8S_JOB.read_text()) if d["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["torchrun"]
    argv = container["args"]
    split = argv.index("-m")
    assert argv[split + 1] == "gpt1", argv
    return argv[:split], argv[split + 2 :]


def flag_values(argv: list[str]) -> dict[str, str]:
    return dict(zip(argv[::2], argv[1::2]))


def test_slurm_and_kubernetes_run_the_same_command():
    """Both cluster examples launch the same `gpt1 pretrain` with the same rendezvous settings;
    only the values a scheduler supplies (node count, GPUs, head node, job id, paths) differ."""
    (slurm_flags, slurm_gpt1), (k8s_flags, k8s_gpt1) = slurm_torchrun(), k8s_torchrun()
    slurm, k8s = flag_values(slurm_flags), flag_values(k8s_flags)
    assert list(slurm) == list(k8s)
    assert slurm["--rdzv-backend"] == k8s["--rdzv-backend"] == "c10d"
    assert slurm["--max-restarts"] == k8s["--max-restarts"] == "0"
    assert slurm["--rdzv-endpoint"].endswith(":29500") and k8s["--rdzv-endpoint"].endswith(":29500")
    paths = {"--data", "--out"}
    mask = lambda argv: ["PATH" if i and argv[i - 1] in paths else a for i, a in enumerate(argv)]
    assert mask(slurm_gpt1) == mask(k8s_gpt1)
    assert slurm_gpt1[:3] == ["pretrain", "--preset", "gpt1"] and "--resume" in slurm_gpt1


def test_the_clusters_page_shows_the_scripts_as_they_are():
    page = (ROOT / "docs" / "clusters.md").read_text()
    for file in (SLURM_SCRIPT, K8S_JOB):
        assert f"\n{file.read_text()}```" in page, f"docs/clusters.md differs from {file}"


@pytest.mark.slow
def test_two_nodes_match_one(tiny_corpus, one_process, tmp_path):
    # Two torchrun agents, one process each, find each other through a c10d rendezvous as two
    # machines would; here both are this machine, on 127.0.0.1 only. The launcher flags and the
    # gpt1 command are the SLURM script's (scripts/cluster/pretrain.sbatch, shown in
    # docs/clusters.md) with SLURM's values filled in, then the tiny run's settings appended.
    two = tmp_path / "nodes"
    flags, gpt1_args = slurm_torchrun()
    values = {
        "SLURM_NNODES": "2",
        "GPUS_PER_NODE": "1",
        "HEAD_NODE": "127.0.0.1",
        "SLURM_JOB_ID": "gpt1-test",
        "DATA": str(tiny_corpus),
        "RUN": str(two),
    }
    fill = lambda argv: [string.Template(a).substitute(values) for a in argv]
    flags = fill(flags)
    endpoint = flags.index("--rdzv-endpoint") + 1
    flags[endpoint] = f"127.0.0.1:{free_port()}"  # the script's fixed port may be taken here
    agent = [*TORCHRUN, *flags, "--local-addr", "127.0.0.1"]
    tiny_flags = cmd([], tiny_corpus, two)[4:]  # what follows `-m gpt1 --quiet pretrain`
    argv = [*agent, "-m", "gpt1", *fill(gpt1_args), *tiny_flags]
    assert "--quiet" not in gpt1_args
    procs = [
        subprocess.Popen(
            [*argv, "--quiet"],
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert_same_run(one_process, two, trackers=("tensorboard", "trackers.json"))
    # The script's --logger tensorboard: only rank 0 logged, one event file, every step once.
    events = list((two / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1, events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(two / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == list(range(1, 7))


@pytest.mark.slow
@pytest.mark.parametrize("lm_coef", ["0.5", "0"])  # 0: no auxiliary LM, the classifier's `at=` pass
def test_fsdp2_fine_tuning_equals_ddp(tmp_path, shared_data, gpt1_vocab, lm_coef):
    # Same ranks, same seeds, same dropout masks: FSDP2 and DDP are two ways of computing the
    # same update. Checkpoints are written from the unsharded weights, and the score after
    # training is computed from them.
    data = tmp_path / "sst2"
    data.mkdir()
    for split in ("train", "dev"):
        lines = (shared_data / "glue" / "SST-2" / f"{split}.tsv").read_text().splitlines()[:25]
        (data / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    runs = {}
    for mode in ("ddp", "fsdp"):
        runs[mode] = tmp_path / mode
        argv = tiny_finetune(data, gpt1_vocab, runs[mode], 3, "--save-every", "2", task=SST2)
        argv += ["--set", f"train.distributed={mode}", "--set", f"finetune.lm_coef={lm_coef}"]
        run(gpt1_process(*argv, launcher=TORCHRUN_TWO_PROCESSES))
    ddp, fsdp = (records(runs[m], "loss") for m in ("ddp", "fsdp"))
    np.testing.assert_allclose([v for _, v in fsdp], [v for _, v in ddp], rtol=2e-5)
    for name in ("model.safetensors", "head.safetensors"):
        a, b = (load_file(str(runs[m] / "final" / name)) for m in ("ddp", "fsdp"))
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    results = [json.loads((runs[m] / "results.json").read_text()) for m in ("ddp", "fsdp")]
    assert results[0] == results[1] and results[0]["n"] == 24


@pytest.mark.slow
def test_second_torchrun_launch_on_a_held_run_is_refused(tmp_path):
    """The run lock under torchrun (a row of the fault table): rank 0 of a running launch holds
    the folder; a second launch on it is refused with gpt1's one-line error naming that rank,
    torchrun stops the second launch's other rank (no hang in rendezvous), the first launch
    runs on, and no step of its metrics is written twice."""
    result = fault_cases.two_torchrun_launches_one_run(tmp_path)
    assert result.problems == () and result.data_lost == 0, result.outcome
