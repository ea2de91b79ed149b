"""The end-to-end decode benchmark (python -m mlx_fp4.bench decode) on a CI-sized Llama on the CPU:
every variant runs in its own process, reports positive tok/s, and ours decodes the same greedy
tokens as MLX's nvfp4 layers on the same bytes."""

import json

import pytest

pytest.importorskip("mlx_lm")
from mlx_fp4.bench import decode  # noqa: E402


def test_tiny_decode_all_variants(tmp_path):
    rc = decode.main(["--preset", "tiny", "--layers", "2", "--prompt", "6", "--tokens", "6", "--repeats", "1",
                      "--device", "cpu", "--out", str(tmp_path), "--no-plot"])
    assert rc == 0
    doc = json.loads((tmp_path / "decode_tiny_cpu.json").read_text())
    (point,) = doc["points"]
    assert set(point["variants"]) == set(decode.VARIANTS)
    pids = {r["pid"] for r in doc["raw"]}
    assert len(pids) == len(decode.VARIANTS)  # one process per variant
    for name, v in point["variants"].items():
        assert v["decode_tok_s"]["median"] > 0 and v["prefill_tok_s"]["median"] > 0, name
        assert len(v["tokens"]) == 6
    q = point["variants"]["mlx_nvfp4"]
    assert point["variants"]["dense"]["weight_bytes_per_step"] > 3 * q["weight_bytes_per_step"]
    for name in ("fp4", "fp4_fused"):
        v = point["variants"][name]
        assert v["weight_bytes_per_step"] == q["weight_bytes_per_step"]  # the same bytes
        assert v["first_token_difference_vs_mlx_nvfp4"] is None, name


def test_bad_arguments_are_rejected():
    with pytest.raises(SystemExit):
        decode.main(["--preset", "tiny", "--repeats", "0", "--device", "cpu"])


def test_tiny_gpt_oss_decodes_in_mxfp4(tmp_path):
    """The gpt-oss preset quantizes in MXFP4 (its published format); ours decodes the same greedy
    tokens as MLX's mxfp4 layers on the same bytes."""
    rc = decode.main(["--preset", "tiny-gpt-oss", "--layers", "2", "--prompt", "6", "--tokens", "4", "--repeats", "1",
                      "--variants", "mlx_nvfp4", "fp4", "--device", "cpu", "--out", str(tmp_path), "--no-plot"])
    assert rc == 0
    (point,) = json.loads((tmp_path / "decode_tiny-gpt-oss_cpu.json").read_text())["points"]
    ours, theirs = point["variants"]["fp4"], point["variants"]["mlx_nvfp4"]
    assert ours["weight_bytes_per_step"] == theirs["weight_bytes_per_step"]
    assert ours["first_token_difference_vs_mlx_nvfp4"] is None
