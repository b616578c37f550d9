"""`--threads` and the `auto` policy (gpt1.threads): the count follows what other jobs leave free."""

from __future__ import annotations

import sys

import pytest
import torch

from gpt1 import threads
from gpt1.cli import USES_THREADS, build_parser, main
from gpt1.errors import ConfigError
from helpers.tiny import make_corpus, tiny_pretrain


@pytest.fixture(autouse=True)
def restore_threads():
    """Each test may change torch's count and the governor; the suite runs with one thread."""
    before = torch.get_num_threads()
    yield
    threads._governor.stop()
    torch.set_num_threads(before)


def sample(busy: int, total: int, own: float, at: float) -> threads._Sample:
    return threads._Sample(busy=busy, total=total, own_seconds=own, at=at)


def test_parse_threads_accepts_auto_and_positive_numbers_only():
    assert threads.parse_threads("auto") == "auto"
    assert threads.parse_threads(" AUTO ") == "auto"
    assert threads.parse_threads("3") == 3
    for bad in ("0", "-1", "1.5", "many", ""):
        with pytest.raises(ConfigError, match="--threads"):
            threads.parse_threads(bad)


def test_threads_for_counts_whole_free_cpus_and_at_least_one():
    assert threads.threads_for(0.0, 2) == 1  # both CPUs busy with other jobs
    assert threads.threads_for(1.0, 2) == 1  # one busy job beside us
    assert threads.threads_for(1.6, 2) == 1  # under 75% of the second CPU free
    assert threads.threads_for(1.8, 2) == 2
    assert threads.threads_for(2.0, 2) == 2
    assert threads.threads_for(7.9, 8) == 8
    assert threads.threads_for(None, 4) == 4  # unmeasurable: torch's own choice


def test_free_between_does_not_count_this_process_as_load():
    # 2 CPUs, 1 s, 100 ticks/s each: 200 ticks, 150 busy, of which our own 1.0 CPU-second (100).
    before, after = sample(0, 0, 0.0, 0.0), sample(150, 200, 1.0, 1.0)
    assert threads._free_between(before, after, 2) == pytest.approx(1.5)
    # The same ticks with none of them ours: half a CPU free.
    assert threads._free_between(before, sample(150, 200, 0.0, 1.0), 2) == pytest.approx(0.5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_measure_free_reads_the_kernel_counters():
    cpus = threads.usable_cpus()
    free, last = threads.measure_free(cpus, seconds=0.05)
    assert free is not None and 0.0 <= free <= len(cpus)
    assert last is not None and last.total > 0


def test_cpu_quota_reads_a_cgroup_limit(tmp_path):
    limit = tmp_path / "cpu.max"
    limit.write_text("150000 100000\n")
    assert threads.cpu_quota(str(limit)) == 2
    limit.write_text("max 100000\n")
    assert threads.cpu_quota(str(limit)) is None
    assert threads.cpu_quota(str(tmp_path / "absent")) is None


def test_auto_runs_one_thread_beside_busy_jobs_and_all_when_idle(monkeypatch):
    monkeypatch.delenv("GPT1_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(threads, "cpu_quota", lambda: None)
    monkeypatch.setattr(threads, "measure_free", lambda cpus: (0.1, None))
    assert threads.apply_threads() == 1 and torch.get_num_threads() == 1
    monkeypatch.setattr(threads, "measure_free", lambda cpus: (1.95, None))
    assert threads.apply_threads("auto") == 2 and torch.get_num_threads() == 2


def test_a_number_the_environment_or_omp_num_threads_fix_the_count(monkeypatch):
    monkeypatch.setattr(threads, "measure_free", lambda cpus: pytest.fail("measured"))
    monkeypatch.setenv("GPT1_THREADS", "2")
    assert threads.apply_threads(None) == 2 and torch.get_num_threads() == 2
    assert threads.apply_threads(1) == 1  # the flag wins over the environment
    monkeypatch.delenv("GPT1_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.apply_threads(None) == 2
    monkeypatch.setenv("GPT1_THREADS", "lots")
    with pytest.raises(ConfigError, match=r"\$GPT1_THREADS.*'lots'"):
        threads.apply_threads(None)


def test_adapt_follows_load_that_arrives_and_leaves(monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock["now"])
    readings = iter(
        [
            sample(190, 200, 0.0, 105.0),  # 5 s later: other jobs kept both CPUs busy
            sample(195, 400, 0.0, 110.0),  # then they left (5 busy ticks of 200)
        ]
    )
    monkeypatch.setattr(threads, "_sample", lambda cpus: next(readings))
    torch.set_num_threads(2)
    threads._governor.start([0, 1], sample(0, 0, 0.0, 100.0))
    clock["now"] = 102.0
    threads.adapt()  # not due yet: nothing read, nothing changed
    assert torch.get_num_threads() == 2
    clock["now"] = 105.0
    threads.adapt()
    assert torch.get_num_threads() == 1
    clock["now"] = 110.0
    threads.adapt()
    assert torch.get_num_threads() == 2


def test_adapt_does_nothing_when_the_count_was_fixed(monkeypatch):
    monkeypatch.setattr(threads, "_sample", lambda cpus: pytest.fail("measured"))
    threads.apply_threads(1)
    threads.adapt()
    assert torch.get_num_threads() == 1


def test_every_computing_command_takes_threads_and_main_applies_it(monkeypatch):
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name in USES_THREADS - {"analysis"}:
        assert "--threads" in commands[name].format_help(), name
    assert "--threads" not in commands["info"].format_help()
    # A command with sub-commands takes it after the sub-command, like its other flags.
    args = parser.parse_args(["analysis", "positions", "runs/x", "--threads", "3"])
    assert args.threads == 3
    seen = {}
    monkeypatch.setattr("gpt1.cli.sample.run", lambda args: seen.update(n=torch.get_num_threads()))
    torch.set_num_threads(1)
    assert main(["sample", "some/checkpoint", "--prompt", "hi", "--threads", "2"]) == 0
    assert seen["n"] == 2


def test_bad_threads_are_one_line_usage_errors(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sample", "some/checkpoint", "--prompt", "hi", "--threads", "0"])
    assert exit_info.value.code == 2
    assert "--threads must be 'auto' or a positive whole number" in capsys.readouterr().err
    monkeypatch.setenv("GPT1_THREADS", "zero")
    monkeypatch.setattr("gpt1.cli.sample.run", lambda args: pytest.fail("ran"))
    assert main(["sample", "some/checkpoint", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpt1 sample: error: $GPT1_THREADS") and "\n" not in err


def test_training_keeps_its_thread_count_and_a_resume_takes_the_recorded_one(
    tmp_path, monkeypatch, capsys
):
    """In auto mode the count that follows the load is pinned for a training run (gradients'
    last bits depend on it), recorded in its checkpoints, and taken again by a resume."""
    from gpt1.cli import main
    from gpt1.train.state import read_trainer_json

    monkeypatch.delenv("GPT1_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(threads, "cpu_quota", lambda: None)
    monkeypatch.setattr(threads, "_sample", lambda cpus: pytest.fail("re-measured in training"))
    data, run = make_corpus(tmp_path / "data"), tmp_path / "run"
    monkeypatch.setattr(threads, "measure_free", lambda cpus: (1.95, None))  # idle: 2 threads
    assert main(tiny_pretrain(data, run, 2)) == 0
    assert read_trainer_json(run / "step-2")["threads"] == 2
    monkeypatch.setattr(threads, "measure_free", lambda cpus: (0.1, None))  # busy now: 1
    capsys.readouterr()
    assert main([*tiny_pretrain(data, run, 3), "--resume", "auto"]) == 0
    assert read_trainer_json(run / "step-3")["threads"] == 2  # the run's count, not the load's
    err = capsys.readouterr().err.splitlines()  # the measured count, then the one it runs with
    assert err[0] == "threads: 1 (auto: 0.1 of 2 CPUs free)"
    assert "threads: 2 (resumed: the count this run was started with)" in err
    threads._governor.stop()


def test_every_computing_command_says_what_threads_it_chose(monkeypatch, capsys):
    """One status line on stderr, before the command's own work: the count and why."""
    monkeypatch.delenv("GPT1_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(threads, "cpu_quota", lambda: None)
    monkeypatch.setattr(threads, "measure_free", lambda cpus: (1.95, None))
    seen = []
    commands = {"sample": ["x", "--prompt", "hi"], "predict": ["x"], "evaluate": ["x"]}
    for name, rest in commands.items():  # main applies the policy: one place for all commands
        monkeypatch.setattr(f"gpt1.cli.{name}.run", lambda a: seen.append(a))
        assert main([name, *rest]) == 0, name
        err = capsys.readouterr().err
        assert err.splitlines()[0] == "threads: 2 (auto: 1.9 of 2 CPUs free)", name
    assert len(seen) == len(commands)
    monkeypatch.setattr(threads, "cpu_quota", lambda: 1)
    assert main(["sample", "x", "--prompt", "hi", "--threads", "auto"]) == 0
    assert "threads: 1 (auto: 1.9 of 2 CPUs free, CPU quota 1)" in capsys.readouterr().err
    monkeypatch.setenv("GPT1_THREADS", "2")
    assert main(["sample", "x", "--prompt", "hi"]) == 0
    assert "threads: 2 ($GPT1_THREADS)" in capsys.readouterr().err
    assert main(["sample", "x", "--prompt", "hi", "--threads", "1"]) == 0
    assert "threads: 1 (--threads)" in capsys.readouterr().err
    assert main(["sample", "x", "--prompt", "hi", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_a_refused_command_prints_only_its_error(tmp_path, monkeypatch, capsys):
    """The thread-count line waits for a status line, so a refusal stays one line."""
    monkeypatch.setenv("GPT1_THREADS", "1")
    assert main(["sample", str(tmp_path / "absent"), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("gpt1 sample: error:"), err


def test_a_refused_command_says_nothing_of_a_capped_thread_count(tmp_path, monkeypatch, capsys):
    """The cap's warning waits with the thread-count line: a refusal stays one line, a command
    that runs says it (at its end under --quiet)."""
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(threads, "_capped", set())
    argv = ["evaluate", str(tmp_path / "absent"), "--micro-batch", "0", "--threads", "999999"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["gpt1 evaluate: error: --micro-batch must be >= 1, got 0"]
    monkeypatch.setattr(threads, "_capped", set())
    monkeypatch.setattr("gpt1.cli.evaluate.run", lambda args: 0)
    assert main(["--quiet", *argv]) == 0
    warning = "--threads: 999999 capped at 2, the CPUs this process may use"
    assert capsys.readouterr().err.splitlines() == [warning]


def test_a_count_beyond_the_cpus_is_capped_with_one_warning(monkeypatch, caplog):
    # torch.set_num_threads(999999) printed a false "out of memory", then the process segfaulted
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(threads, "_capped", set())
    for count in (999999, 999999, 10**30):
        assert threads.apply_threads(count) == 2 and torch.get_num_threads() == 2
        threads.announce_now()  # held like the thread-count line, said with it
    capped = [r.getMessage() for r in caplog.records if r.name == "gpt1.threads" and r.levelno > 20]
    assert capped == [
        "--threads: 999999 capped at 2, the CPUs this process may use",
        f"--threads: {10**30} capped at 2, the CPUs this process may use",
    ]


def test_digits_int_cannot_read_are_refused_not_a_traceback(monkeypatch):
    with pytest.raises(ConfigError, match="--threads"):
        threads.parse_threads("²")
    monkeypatch.delenv("GPT1_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "²")
    assert threads.requested_threads(None) == "auto"
