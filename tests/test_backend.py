"""The kernel seam (`gpt1.inference.backend`): the environment's switches in their usual spellings
(and a bad one refused in one line), the int8 and float speed checks that keep a slower kernel
out, one failure memory, and `gpt1 info --kernels`."""

import json
import warnings

import pytest
import torch

from gpt1 import GPT, ModelConfig
from gpt1.cli import main
from gpt1.errors import ConfigError
from gpt1.inference import backend, kernel_build, timings
from gpt1.inference.prepared import for_inference
from gpt1.inference.quantize import PackedInt8, int8_linear, quantize_rows


@pytest.mark.parametrize("name", list(backend.SWITCHES))
def test_switches_take_the_usual_spellings_in_any_case(name, monkeypatch):
    for on in ["1", "on", "ON", "true", "True", " on "]:
        monkeypatch.setenv(name, on)
        assert backend.switch(name) is True
    for off in ["0", "off", "Off", "false", "FALSE"]:
        monkeypatch.setenv(name, off)
        assert backend.switch(name) is False
    monkeypatch.setenv(name, "")
    assert backend.switch(name) is None
    monkeypatch.setenv(name, "torch")
    if backend.SWITCHES[name]:
        assert backend.switch(name) is False  # torch's kernels
    else:
        with pytest.raises(ConfigError):
            backend.switch(name)


@pytest.mark.parametrize("name", [*backend.SWITCHES, kernel_build.MARCH_VARIABLE])
def test_a_bad_switch_is_refused_in_one_line_before_any_work(name, monkeypatch, capsys):
    monkeypatch.setenv(name, "yes please")
    with pytest.raises(ConfigError, match=name):
        backend.check_environment()
    config = ModelConfig(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    with pytest.raises(ConfigError, match=name):
        for_inference(GPT(config), "cpu", "fp32")
    assert main(["info", "--kernels"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and name in err[0]


def test_gpt1_matvec_off_means_off_and_builds_nothing(monkeypatch):
    """`0`/`off` used to build and use the kernel (only `torch` was understood)."""

    def no_build():
        raise AssertionError("built")

    monkeypatch.setattr(kernel_build, "module", no_build)
    monkeypatch.setattr(kernel_build, "module_if_built", no_build)
    monkeypatch.setattr(backend, "_decoding", True)  # a decoding process
    for off in ["0", "off", "false", "torch"]:
        monkeypatch.setenv("GPT1_MATVEC", off)
        assert backend.few_rows_kernel() is None and backend.decode_step_op() is None


@pytest.mark.parametrize(
    ("probe", "choice"),
    [
        (
            backend.Int8Probe(float_path=1.0, s8=0.1, u8=0.2, rows_s8=9e9, rows_u8=9e9),
            "s8",
        ),  # AMX: signed is real
        (
            backend.Int8Probe(float_path=1.0, s8=900.0, u8=0.1, rows_s8=9e9, rows_u8=9e9),
            "u8",
        ),  # VNNI, no AMX
        (
            backend.Int8Probe(float_path=1.0, s8=900.0, u8=1.5, rows_s8=9e9, rows_u8=9e9),
            None,
        ),  # both slower: float path
        (
            backend.Int8Probe(
                float_path=1.0, s8=float("inf"), u8=float("inf"), rows_s8=9e9, rows_u8=9e9
            ),
            None,
        ),  # failed
    ],
)
def test_the_int8_product_never_runs_slower_than_the_float_path(probe, choice, monkeypatch):
    monkeypatch.delenv("GPT1_INT8_MATMUL", raising=False)
    monkeypatch.setattr(backend, "int8_probe", lambda: probe)
    monkeypatch.setattr(backend, "onednn_int8_exact", lambda encoding: True)  # the choice alone
    monkeypatch.setattr(backend, "_failures", {})
    assert backend.int8_many_rows() == choice
    monkeypatch.setenv("GPT1_INT8_MATMUL", "on")  # forced: the faster encoding, unchecked
    assert backend.int8_many_rows() == probe.fastest
    monkeypatch.setenv("GPT1_INT8_MATMUL", "off")
    assert backend.int8_many_rows() is None


def test_int8_many_rows_takes_the_float_path_where_the_kernel_is_slower(monkeypatch):
    monkeypatch.delenv("GPT1_INT8_MATMUL", raising=False)
    slow = backend.Int8Probe(float_path=1.0, s8=900.0, u8=2.0, rows_s8=9e9, rows_u8=9e9)
    monkeypatch.setattr(backend, "int8_probe", lambda: slow)

    def oneDNN(*args, **kwargs):
        raise AssertionError("oneDNN's int8 product ran")

    monkeypatch.setattr(PackedInt8, "product", oneDNN)
    q, scale = quantize_rows(torch.randn(48, 32))
    out = int8_linear(torch.randn(40, 32), q, scale, None, PackedInt8())
    assert out.shape == (40, 48)


def _int8_probe_is_sound(probe: backend.Int8Probe) -> None:
    assert probe.float_path < float("inf")
    assert probe.choice in (None, "s8", "u8")
    if probe.choice is not None:
        assert getattr(probe, probe.choice) <= probe.float_path


def _float_probe_is_sound(probe: backend.FloatProbe) -> None:
    for rows in ("few", "many"):
        packed, plain = probe.times["float32"][rows]
        assert 0 < packed < 1 and 0 < plain < 1  # one product's time, in seconds


@pytest.mark.parametrize(
    ("name", "available", "sound"),
    [
        ("int8", backend.onednn_has_int8, _int8_probe_is_sound),
        ("float", lambda: backend.onednn_packs(torch.float32), _float_probe_is_sound),
    ],
)
def test_each_probe_times_its_paths_once_per_cpu(name, available, sound, monkeypatch, tmp_path):
    """Measured once per process, kept in the build folder for the next process."""
    if not available():
        pytest.skip(f"this torch has no oneDNN kernel for the {name} probe")
    probed = getattr(backend, f"{name}_probe")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(timings.os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # busy, but steady
    probed.cache_clear()
    try:
        probe = probed()
        sound(probe)
        assert probed() is probe  # once per process
        probed.cache_clear()

        def measure():
            raise AssertionError("measured again")

        monkeypatch.setattr(backend, f"_measure_{name}", measure)
        assert probed() == probe  # and kept for the next process
    finally:
        probed.cache_clear()


def _float_probe(few: tuple[float, float], many: tuple[float, float]) -> backend.FloatProbe:
    """A probe with fp32's [packed, plain] times for a few rows and for many."""
    return backend.FloatProbe({"float32": {"few": list(few), "many": list(many)}})


@pytest.mark.skipif(not backend.onednn_packs(torch.float32), reason="no oneDNN packing here")
@pytest.mark.parametrize("rows", [1, 64])
def test_the_packed_float_product_never_runs_where_f_linear_is_faster(rows, monkeypatch):
    """Without gpt1's kernel, a product runs on oneDNN's packed copy only where the probe found
    it not slower than F.linear, for that many rows; GPT1_PREPACK=1 packs regardless."""
    from gpt1.inference.prepack import PackedWeight

    monkeypatch.setenv("GPT1_MATVEC", "torch")
    monkeypatch.delenv("GPT1_PREPACK", raising=False)
    x, w = torch.randn(rows, 32), torch.randn(48, 32)
    fast, slow = (1.0, 2.0), (2.0, 1.0)  # [packed, plain] seconds
    for few, many, packs in [(slow, fast, rows == 64), (fast, slow, rows == 1), (fast, fast, True)]:
        monkeypatch.setattr(
            backend, "float_probe", lambda few=few, many=many: _float_probe(few, many)
        )
        kernel = PackedWeight()
        with torch.inference_mode():
            out = kernel.linear(x, w, None)
        torch.testing.assert_close(out, torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)
        assert (kernel._packed is not None) == packs, (few, many)
    monkeypatch.setattr(backend, "float_probe", lambda: _float_probe(slow, slow))
    monkeypatch.setenv("GPT1_PREPACK", "1")
    kernel = PackedWeight()
    with torch.inference_mode():
        kernel.linear(x, w, None)
    assert kernel._packed is not None  # forced on
    assert backend.packed_is_faster(torch.bfloat16, few_rows=True)  # unmeasured: the default


def test_a_failure_is_remembered_and_warned_once(monkeypatch):
    monkeypatch.setattr(backend, "_failures", {})
    with pytest.warns(RuntimeWarning, match=r"it broke \(bad thing\); the other path runs"):
        backend.fail(
            "many rows int8", "it broke", RuntimeError("bad thing\ndetail"), "the other path runs"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.fail("many rows int8", "it broke", RuntimeError("again"), "x")
    assert backend.failure("many rows int8") == "bad thing"
    assert backend.int8_many_rows() is None


def test_info_kernels_names_each_kind_its_implementation_and_why(monkeypatch, capsys):
    monkeypatch.delenv("GPT1_INT8_MATMUL", raising=False)
    monkeypatch.setattr(backend, "int8_probe", lambda: backend.Int8Probe(1e-3, 1.0, 1e-4, 9e9, 9e9))
    monkeypatch.setattr(backend, "onednn_has_int8", lambda: True)
    monkeypatch.setattr(backend, "onednn_int8_exact", lambda encoding: False)
    monkeypatch.setenv("GPT1_MATVEC", "torch")
    assert main(["info", "--kernels", "--json"]) == 0
    kinds = {k["kind"]: k for k in json.loads(capsys.readouterr().out)["kernels"]}
    assert "saturate" in kinds["many rows int8"]["why"]
    own = "gpt1's int8 kernel" if backend.few_rows_int8() else "float path"
    assert kinds["many rows int8"]["implementation"].startswith(own)
    monkeypatch.setattr(backend, "onednn_int8_exact", lambda encoding: True)
    assert main(["info", "--kernels"]) == 0
    out = capsys.readouterr().out
    for kind in backend.KINDS:
        assert kind in out
    assert "oneDNN int8, unsigned" in out and "GPT1_MATVEC switches it off" in out
    monkeypatch.setattr(backend, "int8_probe", lambda: backend.Int8Probe(1e-3, 1.0, 1.0, 9e9, 9e9))
    assert main(["info", "--kernels", "--json"]) == 0
    kinds = {k["kind"]: k for k in json.loads(capsys.readouterr().out)["kernels"]}
    assert kinds["many rows int8"]["implementation"] == "float path"
    assert "slower" in kinds["many rows int8"]["why"]
    if backend.onednn_packs(torch.float32):  # the float products' choice, with its times
        monkeypatch.setattr(
            backend, "float_probe", lambda: _float_probe((2e-3, 1e-3), (1e-3, 2e-3))
        )
        assert main(["info", "--kernels", "--json"]) == 0
        kinds = {k["kind"]: k for k in json.loads(capsys.readouterr().out)["kernels"]}
        assert "F.linear (fp32)" in kinds["few rows"]["implementation"]
        assert "fp32 packed 2 ms, F.linear 1 ms" in kinds["few rows"]["why"]
        assert "oneDNN packed (fp32)" in kinds["many rows fp32/bf16"]["implementation"]


def test_evaluate_does_not_build_the_kernel(tmp_path, monkeypatch, capsys):
    """A command that does not decode never waits for a build (it once ran 866 s silently while
    another environment's build ran); it uses a build only where one is there."""
    from helpers.tiny import tiny_finetuned_run

    run, task = tiny_finetuned_run(tmp_path)

    def no_build(*args):
        raise AssertionError("evaluate built the kernel")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "no_builds"))
    monkeypatch.delenv("GPT1_MATVEC", raising=False)
    monkeypatch.setattr(kernel_build, "_compile", no_build)
    backend.reset()
    try:
        for precision in ["fp32", "int8"]:
            argv = ["evaluate", str(run), "--data", str(task), "--split", "dev"]
            assert main([*argv, "--precision", precision, "--device", "cpu", "--overwrite"]) == 0
        assert "building" not in capsys.readouterr().err
    finally:
        backend.reset()


def test_plans_are_made_by_for_inference_without_process_wide_hooks():
    """No hook on every module registration in the process (each one would cost every model's
    users); the plan is made when the model is prepared and checked against what it took."""
    from torch.nn.modules import module as torch_module

    from gpt1.inference import block_step

    assert not torch_module._global_module_registration_hooks
    assert not torch_module._global_parameter_registration_hooks
    assert not torch_module._global_buffer_registration_hooks
    config = ModelConfig(vocab_size=300, n_positions=80, n_embd=64, n_layer=2, n_head=4)
    model = for_inference(GPT(config), "cpu", "fp32")
    made = block_step._plans[model]
    assert made.layout is not None and made.current() and made.unchanged()
    if backend.decode_step_op() is not None:
        with torch.no_grad():
            assert block_step.plan(model, torch.zeros(1, 64)) is made.layout  # kept


def test_a_process_with_capped_instructions_keeps_its_own_probe_times(monkeypatch):
    """Each cap (oneDNN's, MKL's, ATen's) changes which kernels run: the times of a process
    under any of them are not the uncapped host's, nor another cap's."""
    for name in timings.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    keys = [timings._key()]
    for name in timings.ISA_CAPS:
        monkeypatch.setenv(name, "AVX2")
        keys.append(timings._key())
    assert len(set(keys)) == len(timings.ISA_CAPS) + 1
