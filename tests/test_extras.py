"""A missing optional package is one line naming the extra to install, for every command that
uses one (gpt1.extras.require); the package is hidden by a `None` entry in sys.modules, which makes
its import fail as it would on a machine without it."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

from gpt1.cli import main
from gpt1.extras import EXTRAS, MissingExtra, install_line, require


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def one_line_error(capsys: pytest.CaptureFixture, command: str, extra: str, module: str) -> None:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"gpt1 {command}: error: "), err
    assert f"needs the '{extra}' extra ({module} is not installed)" in err, err
    assert err.endswith(f"pip install -e '.[{extra}]'"), err


def test_require_names_the_extra_and_the_one_install_line(monkeypatch):
    require("serve", "json", what="x")  # present: nothing happens
    hide(monkeypatch, "uvicorn")
    with pytest.raises(MissingExtra) as info:
        require("serve", "json", "uvicorn", what="gpt1 serve")
    assert str(info.value) == (
        "gpt1 serve needs the 'serve' extra (uvicorn is not installed): pip install -e '.[serve]'"
    )
    assert install_line("onnx") == "pip install -e '.[onnx]'"


def test_every_extra_in_pyproject_is_described():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(declared["optional-dependencies"]) == set(EXTRAS)


@pytest.mark.parametrize("module", ["fastapi", "uvicorn", "prometheus_client"])
def test_serve_without_its_extra(monkeypatch, capsys, tmp_path, module):
    hide(monkeypatch, module)
    assert main(["serve", str(tmp_path / "run")]) == 2
    one_line_error(capsys, "serve", "serve", module)


@pytest.mark.parametrize("module", ["onnx", "onnxscript"])
def test_convert_to_onnx_without_its_extra_writes_nothing(monkeypatch, capsys, tmp_path, module):
    hide(monkeypatch, module)
    out = tmp_path / "model.onnx"
    assert main(["convert", str(tmp_path / "run"), str(out), "--from", "gpt1", "--to", "onnx"]) == 2
    one_line_error(capsys, "convert", "onnx", module)
    assert not out.exists()


def test_convert_from_the_hub_without_the_hf_extra(monkeypatch, capsys, tmp_path):
    hide(monkeypatch, "huggingface_hub")
    assert main(["convert", "someone/some-model", str(tmp_path / "out"), "--from", "hf"]) == 2
    one_line_error(capsys, "convert", "hf", "huggingface_hub")


def test_lm_eval_without_its_extra(monkeypatch, capsys):
    hide(monkeypatch, "lm_eval")
    assert main(["lm-eval", "--model_args", "checkpoint=runs/x", "--tasks", "gpt1_sst2"]) == 2
    one_line_error(capsys, "lm-eval", "eval", "lm_eval")


def test_prepare_from_the_hub_without_the_hf_extra(monkeypatch, capsys, tmp_path, tiny_corpus):
    hide(monkeypatch, "datasets")
    argv = ["prepare", "--corpus", "hub:someone/books", "--vocab", str(tiny_corpus)]
    assert main([*argv, "--out", str(tmp_path / "data")]) == 2
    one_line_error(capsys, "prepare", "hf", "datasets")


def test_a_hub_task_without_the_hf_extra(monkeypatch):
    from gpt1.tasks.hub import _load

    hide(monkeypatch, "datasets")
    with pytest.raises(MissingExtra, match=r"'hf' extra \(datasets is not installed\)"):
        _load("glue/sst2", "train")
