"""Smoke tests of the sharded decode benchmark (python -m mlx_fp4.bench sharded) on tiny configs of
its presets: in-process on 1 rank, and under mlx.launch on 2 CPU ranks of the ring backend. No
timing assertions: they check that both implementations ran every phase, that they hold the same
weight bytes, and the all_sum traffic that the sharded plan implies."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("mlx_lm")

from mlx_fp4.bench import __main__ as bench_main  # noqa: E402
from mlx_fp4.bench import sharded  # noqa: E402

TINY = {
    "llama3-8b": ["vocab_size=256", "hidden_size=128", "intermediate_size=256", "num_attention_heads=4",
                  "num_key_value_heads=2"],
    "deepseek-v3": ["vocab_size=256", "hidden_size=128", "intermediate_size=256", "moe_intermediate_size=32",
                    "n_routed_experts=8", "num_experts_per_tok=2", "n_group=2", "topk_group=1",
                    "num_attention_heads=4", "num_key_value_heads=4", "q_lora_rank=32", "kv_lora_rank=32",
                    "qk_rope_head_dim=16", "v_head_dim=32", "qk_nope_head_dim=32"],
}
FAST = ["--layers", "2", "--steps", "2", "--prompt", "4", "--prefill", "16", "--repeats", "1", "--device", "cpu"]


def _args(preset, out):
    return ["sharded", "--preset", preset, *FAST, "--out", str(out), "--set", *TINY[preset]]


def _check_doc(doc, ranks):
    assert doc["ranks"] == ranks and doc["layers"] == 2
    assert set(doc["results"]) == set(sharded.IMPLS)
    b = doc["weight_bytes_per_rank"]
    assert b["mlx_fp4"] == b["mlx_nvfp4"] > 0, "both implementations hold the same nvfp4 bytes"
    modes = {"real", "off"} if ranks > 1 else {"real"}
    for r in doc["results"].values():
        assert set(r) == modes | {"traffic"}
        for mode in modes:
            assert set(r[mode]) == {"decode", "prefill"}
            assert all(p["tokens_per_s"] > 0 for p in r[mode].values())
    return {impl: r["traffic"] for impl, r in doc["results"].items()}


@pytest.mark.parametrize("preset", list(TINY))
def test_one_rank(tmp_path, preset):
    assert bench_main.main(_args(preset, tmp_path)) == 0
    doc = json.loads((tmp_path / f"sharded_{preset}_1rank.json").read_text())
    traffic = _check_doc(doc, 1)
    assert all(t["all_sum_calls"] == 0 for ts in traffic.values() for t in ts), "one rank: no all_sum"
    # the scaling table of a run over itself: 1.00x everywhere
    table = sharded.compare(*[str(tmp_path / f"sharded_{preset}_1rank.json")] * 2)
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| mlx")]
    assert len(rows) == 2 * 2 and all(r[5].strip() == "1.00x" for r in rows), table


def test_two_ranks_ring(tmp_path):
    """The tiny DeepSeek-V3 config (layer 0 dense, layer 1 MoE) under mlx.launch -n 2 --backend
    ring: every rank finishes, rank 0 writes the JSON; per forward 2 all_sums per layer (o_proj,
    and down_proj or the MoE block's). One launch only: each rank imports mlx-lm (seconds on CI)."""
    import mlx.core as mx
    from test_distributed import _free_port_block, _launcher

    if not mx.distributed.is_available("ring"):
        pytest.skip("MLX was built without the ring backend")
    launcher = _launcher()
    if launcher is None:
        pytest.skip("mlx.launch not found")
    import mlx_fp4

    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(mlx_fp4.__file__)))
    for preset in ["deepseek-v3"]:
        cmd = [*launcher, "-n", "2", "--backend", "ring", "-p", str(_free_port_block(2)), "--python", sys.executable,
               "--env", f"PYTHONPATH={pkg_root}", "-m", "mlx_fp4.bench", *_args(preset, tmp_path),
               "--backend", "ring"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=pkg_root))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        traffic = _check_doc(json.loads((tmp_path / f"sharded_{preset}_2rank.json").read_text()), 2)
        for impl, ts in traffic.items():
            for t in ts:
                assert t["all_sum_calls"] == 2 * 2, (preset, impl, t)
                assert t["bytes"] == t["tokens"] * 128 * WIRE_BYTES[preset][impl], (preset, impl, t)


# all_sum bytes per token and hidden element of the 2-layer config: ours reduces the sharded-to-all
# linears in float32 (4 bytes) and the MoE block's sum in the experts' bf16 (2); MLX all in bf16.
# Layer 0 dense (o_proj + down_proj), layer 1 MoE (o_proj + the MoE block).
WIRE_BYTES = {"deepseek-v3": {"mlx_fp4": 3 * 4 + 2, "mlx_nvfp4": 4 * 2}}
