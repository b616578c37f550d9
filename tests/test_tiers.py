"""The instruction-set tiers the benchmarks simulate (`benchmarks/tiers.py`) cap every library
that multiplies: a tier that caps oneDNN but not MKL lets CTranslate2's int8 (MKL on Intel
CPUs) and torch's fp32 products run the host's widest kernels, and its comparison is unfair."""

import importlib.util
from pathlib import Path

TIERS_FILE = Path(__file__).resolve().parents[1] / "benchmarks" / "tiers.py"


def _tiers() -> dict[str, dict[str, str]]:
    spec = importlib.util.spec_from_file_location("benchmark_tiers", TIERS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TIERS


def test_every_capped_tier_caps_onednn_mkl_ctranslate2_and_gpt1s_build():
    from gpt1.inference import timings
    from gpt1.inference.kernel_build import MARCH_VARIABLE

    for name, caps in _tiers().items():
        if "ONEDNN_MAX_CPU_ISA" not in caps:
            continue  # the host, or gpt1's own switches only
        missing = {"MKL_ENABLE_INSTRUCTIONS", "CT2_FORCE_CPU_ISA", MARCH_VARIABLE} - set(caps)
        assert not missing, f"tier {name} leaves {sorted(missing)} uncapped"
        # a process under the tier keeps its own timing records
        assert set(timings.ISA_CAPS) & set(caps) >= {
            "ONEDNN_MAX_CPU_ISA",
            "MKL_ENABLE_INSTRUCTIONS",
        }
