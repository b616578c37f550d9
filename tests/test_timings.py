"""Kernel timings that do not depend on the moment (`gpt1.inference.timings`): interleaved rounds
and each candidate's best, on a fake clock; a record carries the load, the CPU count and the
torch build it timed; a stale or busy record is timed again, a quiet one kept; and
`gpt1 kernels probe` prints both sides of every product and records them. Nothing here is timed
for real: the measurements are fakes."""

import json
from dataclasses import dataclass

import pytest

from gpt1.cli import main
from gpt1.inference import backend, int8_step, timings


class FakeClock:
    """A clock that a candidate's call advances by the time it is scripted to take this round."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[str] = []

    def __call__(self) -> float:
        return self.now

    def candidate(self, name: str, costs: list[float]):
        remaining = iter(costs)

        def call() -> None:
            self.calls.append(name)
            self.now += next(remaining)

        return call


def test_interleaved_rounds_turn_around_and_keep_each_best():
    clock = FakeClock()
    # one untimed call each, then three rounds; a burst of load (10.0) falls on one round of
    # each, which the best ignores
    fast = clock.candidate("packed", [99.0, 2.0, 10.0, 2.5])
    slow = clock.candidate("plain", [99.0, 3.0, 10.0, 3.5])
    best = timings.interleaved_best({"packed": fast, "plain": slow}, rounds=3, clock=clock)
    assert best == {"packed": 2.0, "plain": 3.0}
    assert clock.calls == ["packed", "plain"] + ["packed", "plain", "plain", "packed"] + [
        "packed",
        "plain",
    ]


def test_short_candidates_get_rounds_until_the_budget_is_spent():
    """A product of 0.1 ms gets hundreds of rounds, not nine: one of them runs undisturbed."""
    clock = FakeClock()
    costs = [0.01] * 3 + [0.004] + [0.01] * 20  # the untimed call, then one per round
    a, b = clock.candidate("a", costs), clock.candidate("b", [0.01] * 30)
    best = timings.interleaved_best({"a": a, "b": b}, rounds=2, clock=clock, budget=0.1)
    assert clock.calls.count("a") == 1 + 6  # 0.02, 0.04, 0.054, 0.074, 0.094, 0.114 s
    assert best == pytest.approx({"a": 0.004, "b": 0.01})


def test_a_candidate_that_fails_is_inf_and_not_timed():
    clock = FakeClock()

    def broken() -> None:
        raise RuntimeError("no kernel for these operands")

    ok = clock.candidate("ok", [1.0, 0.5, 0.25])
    best = timings.interleaved_best({"ok": ok, "broken": broken}, rounds=2, clock=clock)
    assert best == {"ok": 0.25, "broken": float("inf")}


@dataclass(frozen=True)
class Probe:
    seconds: float


class Measurer:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> Probe:
        self.count += 1
        return Probe(self.count / 1000)


@pytest.fixture
def records(tmp_path, monkeypatch):
    """Records in a folder of the test's own, under a load the test sets."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    load = {"now": 0.1}
    monkeypatch.setattr(timings.os, "getloadavg", lambda: (load["now"], 0.0, 0.0))
    monkeypatch.setattr(timings.os, "cpu_count", lambda: 2)
    return load


def test_a_record_carries_its_load_cpus_and_torch_build(records):
    records["now"] = 0.3
    timings.kept("fake", Probe, Measurer())
    found = json.loads(timings.record_path("fake").read_text())
    assert found["times"] == {"seconds": 0.001}
    conditions = found["conditions"]
    assert conditions["load"] == 0.3 and conditions["cpus"] == 2
    assert conditions["build"] == timings.torch_build() and "torch " in conditions["build"]
    assert conditions["at"] > 0


def test_a_quiet_record_is_kept_a_busy_one_timed_again_once_quieter(records):
    measure = Measurer()
    records["now"] = 0.2  # quiet: kept, whatever the load later
    assert timings.kept("fake", Probe, measure) == Probe(0.001)
    records["now"] = 0.0
    assert timings.kept("fake", Probe, measure) == Probe(0.001) and measure.count == 1
    timings.record_path("fake").unlink()
    records["now"] = 8.0  # busy (4 per CPU): recorded as it is
    assert timings.kept("fake", Probe, measure) == Probe(0.002)
    records["now"] = 7.0  # about as busy: kept, not re-timed each run
    assert timings.kept("fake", Probe, measure) == Probe(0.002)
    records["now"] = 5.0  # at most 3/4 of the load: timed again, the quieter record kept
    assert timings.kept("fake", Probe, measure) == Probe(0.003)
    records["now"] = 4.0
    assert timings.kept("fake", Probe, measure) == Probe(0.003)
    records["now"] = 0.5  # quiet
    assert timings.kept("fake", Probe, measure) == Probe(0.004) and measure.count == 4
    records["now"] = 9.0  # a busier machine never replaces a quiet record
    assert timings.kept("fake", Probe, measure) == Probe(0.004)


def test_a_stale_record_is_timed_again(records, monkeypatch):
    measure = Measurer()
    timings.kept("fake", Probe, measure)
    monkeypatch.setattr(timings, "torch_build", lambda: "torch 9.9 reinstalled")
    assert timings.kept("fake", Probe, measure) == Probe(0.002)  # another torch library
    record = timings.record_path("fake")
    record.write_text(json.dumps({"seconds": 5.0}))  # a record without its conditions
    assert timings.kept("fake", Probe, measure) == Probe(0.003)
    assert timings.kept("fake", Probe, measure, again=True) == Probe(0.004)  # asked for


def test_the_reason_names_what_made_a_record_stale():
    quiet = timings.Conditions(load=0.2, cpus=2, build="a", at=0.0)
    busy = timings.Conditions(load=8.0, cpus=2, build="a", at=0.0)
    assert busy.busy and not quiet.busy
    assert timings.stale(quiet, busy) is None
    assert "busy machine" in timings.stale(busy, quiet)
    assert "torch's library" in timings.stale(quiet, timings.Conditions(0.2, 2, "b", 0.0))


def test_gpt1_kernels_probe_prints_both_sides_and_records_the_choice(records, monkeypatch, capsys):
    floats = backend.FloatProbe({"float32": {"few": [9.1e-3, 2.67e-3], "many": [2.14e-3, 2.36e-3]}})
    int8 = backend.Int8Probe(float_path=1e-3, s8=0.5, u8=2e-4, rows_s8=1.0, rows_u8=1e-4)
    monkeypatch.setattr(backend, "_measure_float", lambda: floats)
    monkeypatch.setattr(backend, "_measure_int8", lambda: int8)
    step = int8_step.StepProbe([12, 64], [[2e-3, 1e-3]] * 2, [[1e-3, 1e-3]] * 2)
    monkeypatch.setattr(int8_step, "_measure", lambda: step)
    monkeypatch.setattr(backend, "onednn_packs", lambda dtype: True)
    monkeypatch.setattr(backend, "onednn_has_int8", lambda: True)
    records["now"] = 0.4
    try:
        assert main(["kernels", "probe"]) == 0
        out = capsys.readouterr().out
        assert "load 0.40 on 2 CPUs" in out and "best of at least 9 interleaved rounds" in out
        assert (
            "fp32, one row through four GPT-1 blocks: oneDNN packed 9.1 ms, F.linear 2.67 ms "
            "-> F.linear" in out
        )
        assert "fp32, three 64x768x768 products: oneDNN packed 2.14 ms, F.linear 2.36 ms" in out
        assert "-> unsigned" in out and "signed (oneDNN's reference kernel, on 32x256x256)" in out
        assert "busy" not in out
        assert "int8 step of 64 rows, one GPT-1 block + output layer: one call 2 ms + 1 ms" in out
        assert "-> 12 blocks: integer step from 12 rows" in out
        assert "-> unsigned, one scale per row" in out
        assert backend.float_probe() == floats and backend.int8_probe() == int8  # recorded

        records["now"] = 6.0
        assert main(["kernels", "probe"]) == 0
        assert "the machine is busy" in capsys.readouterr().out
    finally:
        backend.float_probe.cache_clear()
        backend.int8_probe.cache_clear()
        int8_step.step_probe.cache_clear()
