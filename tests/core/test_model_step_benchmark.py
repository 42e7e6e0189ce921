"""benchmarks/model_step.py runs end to end (the CPU smoke configuration: a tiny Llama, one
timed step) and its xsync model trains like the SDPA one: same loss, gradients within bf16
noise. The speed it prints on the CPU means nothing; the H200 run is what the README quotes."""
import importlib.util
import json
import os

import pytest

pytest.importorskip("transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_model_step_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("xsync_bench_model_step",
                                                  os.path.join(ROOT, "benchmarks", "model_step.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--config", "mha64", "--steps", "1", "--tiny", "--device", "cpu", "--out", str(tmp_path)]) == 0
    (row,) = json.load(open(tmp_path / "model_step_tiny_cpu.json"))["rows"]
    assert row["model"].startswith("transformers") and row["seq"] == 48
    assert row["loss_abs_diff"] < 1e-2 and row["max_rel_grad_diff"] < 3e-2
    assert row["xsync_step_ms"] > 0 and row["sdpa_step_ms"] > 0
