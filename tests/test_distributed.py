"""mlx_fp4.distributed: tensor-parallel FP4 layers over 2 ranks of MLX's ring backend.

One `mlx.launch -n 2 --backend ring` on localhost (subprocess, bounded time) runs
tests/distributed_worker.py, which runs every check on both ranks and writes one JSON per
rank; the tests below read those files. Skipped when mlx.launch or the ring backend is not
available (no rank could initialize the group). A hang or crash fails the tests of the
checks that did not finish, with the launcher's output.
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

import mlx_fp4

HERE = Path(__file__).resolve().parent
WORKER = HERE / "distributed_worker.py"
RANKS = 2
TIMEOUT_S = 50  # whole launch; the checks take ~10 s on 2 cores (mostly imports)

CHECKS = [
    "all_to_sharded_layer",
    "sharded_to_all_layer",
    "kernel_is_ours",
    "shard_inplace",
    "k_block_errors",
    "model_fp32",
    "model_bf16",
    "shard_then_convert",
    "mlx_nvfp4_sharded_then_wrapped",
    "switch_shard_inplace",
    "moe_model_fp32",
    "moe_model_bf16",
    "moe_shard_then_convert",
    "moe_errors",
    "mxfp4_layers",
    "mxfp4_k_block_errors",
    "mxfp4_model",
    "mxfp4_shard_then_convert",
]


def _launcher():
    """The mlx.launch command: the script beside the interpreter, on PATH, or the module."""
    cand = Path(sys.executable).with_name("mlx.launch")
    if cand.exists():
        return [str(cand)]
    found = shutil.which("mlx.launch")
    if found:
        return [found]
    try:
        import mlx._distributed_utils.launch  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-c", "import sys; from mlx._distributed_utils.launch import main; sys.exit(main())"]


def _free_port_block(n):
    """A base port p with p .. p+n-1 free on 127.0.0.1 (ring listens on base + rank)."""
    for _ in range(50):
        base = random.randint(20000, 60000 - n)
        socks = []
        try:
            for i in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip("no free localhost ports for the ring backend")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    if not mx.distributed.is_available("ring"):
        pytest.skip("MLX was built without the ring backend")
    launcher = _launcher()
    if launcher is None:
        pytest.skip("mlx.launch not found next to the interpreter or on PATH")
    out = tmp_path_factory.mktemp("dist")
    # The ranks must import this very mlx_fp4 (source tree or installed) and tests/ helpers.
    pkg_root = str(Path(mlx_fp4.__file__).resolve().parent.parent)
    pythonpath = os.pathsep.join(
        [pkg_root, str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    cmd = [
        *launcher,
        "-n", str(RANKS),
        "--backend", "ring",
        "-p", str(_free_port_block(RANKS)),
        "--python", sys.executable,
        "--env", f"PYTHONPATH={pythonpath}",
        "--env", "MLX_FP4_DIST_DEVICE=cpu",
        "--env", "MLX_FP4_DIST_BACKEND=ring",
        str(WORKER),
        str(out),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(HERE.parent),
        start_new_session=True,  # the launcher and both ranks share one process group
    )
    timed_out = False
    try:
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
    log = log.decode(errors="replace")[-6000:]

    states = {}
    for r in range(RANKS):
        f = out / f"rank{r}.json"
        if f.exists():
            states[r] = json.loads(f.read_text())
    if not any(s.get("initialized") for s in states.values()):
        errors = [s.get("init_error") for s in states.values() if s.get("init_error")]
        if timed_out and not errors:
            pytest.fail(f"mlx.launch timed out after {TIMEOUT_S} s before any rank started:\n{log}")
        pytest.skip(f"ring backend unavailable: {errors or log.strip()[-500:]}")
    return {"states": states, "log": log, "timed_out": timed_out}


def _results(ranks, name):
    """The check's result on every rank (asserts that every rank finished it)."""
    res = {}
    for r in range(RANKS):
        state = ranks["states"].get(r)
        if state is None or name not in state.get("checks", {}):
            why = "timed out" if ranks["timed_out"] else "exited"
            pytest.fail(f"rank {r} {why} before finishing {name!r}; launcher output:\n{ranks['log']}")
        res[r] = state["checks"][name]
    return res


def _assert_ok(ranks, name):
    res = _results(ranks, name)
    bad = {r: v["detail"] for r, v in res.items() if not v["ok"]}
    assert not bad, "\n".join(f"rank {r}:\n{d}" for r, d in bad.items())
    return res


def test_all_ranks_ran_everything(ranks):
    for r in range(RANKS):
        st = ranks["states"][r]
        assert st["size"] == RANKS and st["rank"] == r
        assert st.get("done"), f"rank {r} did not finish; launcher output:\n{ranks['log']}"
        assert sorted(st["checks"]) == sorted(CHECKS)


def test_all_to_sharded_layer_matches_reference(ranks):
    """Column-parallel FP4 layer (bias fused, global scale): each rank's slice and the
    all_gather-ed output within the tolerance table; fp32 and bf16; segments 1 and 3."""
    _assert_ok(ranks, "all_to_sharded_layer")


def test_sharded_to_all_layer_matches_reference(ranks):
    """Row-parallel FP4 layer: K split on block boundaries, all_sum, bias once after the sum,
    global scale once; same result on every rank; fp32/bf16, segments 1 and 2, both reduce
    dtypes."""
    _assert_ok(ranks, "sharded_to_all_layer")


def test_sharded_layers_run_our_kernel(ranks):
    """Sharded layers and a sharded mlx-lm model call mlx_fp4.w4a16_matmul and never
    mx.quantized_matmul."""
    _assert_ok(ranks, "kernel_is_ours")


def test_shard_inplace(ranks):
    _assert_ok(ranks, "shard_inplace")


def test_k_off_block_boundary_raises_on_every_rank(ranks):
    res = _assert_ok(ranks, "k_block_errors")
    msgs = [res[r]["detail"] for r in range(RANKS)]
    assert set(msgs[0]) == {
        "shard_linear",
        "shard_linear_segments",
        "shard_inplace",
        "constructor",
        "shard_model",
    }
    assert all(m == msgs[0] for m in msgs), "every rank must raise the same error"


@pytest.mark.parametrize("name", ["model_fp32", "model_bf16"])
def test_sharded_llama_logits_match_unsharded(ranks, name):
    """A tiny mlx-lm Llama (random weights, q/k/v/o and MLP biases) converted with
    mlx_fp4.nn.quantize(global_scale=True), sharded with mlx_fp4.distributed.shard_model:
    same logits as the unsharded FP4 model (bf16 case also with fused SwiGLU MLPs)."""
    _assert_ok(ranks, name)


def test_shard_first_then_convert(ranks):
    """model.shard() of the float model, then mlx_fp4.distributed.quantize: the same bytes
    and global scales as convert-then-shard, and the same logits."""
    _assert_ok(ranks, "shard_then_convert")


def test_mlx_nvfp4_model_sharded_then_wrapped(ranks):
    """An MLX nvfp4 model sharded by plain model.shard() (MLX's quantized sharded layers),
    then mlx_fp4.distributed.quantize: FP4 sharded layers on the same bytes, same logits."""
    _assert_ok(ranks, "mlx_nvfp4_sharded_then_wrapped")


def test_switch_linear_sharded_in_place(ranks):
    """FP4SwitchLinear split as mlx-lm's MoE shard() splits switch_mlp: gate/up by output rows
    (bias rows with them), down along K (partials all_sum-ed), per-expert global scales whole;
    vs the float64 gather reference; K off the 16-element blocks raises on every rank."""
    res = _assert_ok(ranks, "switch_shard_inplace")
    assert res[0]["detail"]["k_error"] == res[1]["detail"]["k_error"]


@pytest.mark.parametrize("name", ["moe_model_fp32", "moe_model_bf16"])
def test_sharded_qwen3_moe_logits_match_unsharded(ranks, name):
    """A tiny mlx-lm Qwen3-MoE (8 experts, top-2; random weights) converted with global scales
    and sharded with shard_model (model.shard()'s own plan): the same logits as unsharded
    (bf16 case with fused FP4SwitchGLU experts)."""
    _assert_ok(ranks, name)


def test_moe_shard_first_then_convert(ranks):
    """Plain model.shard() of the float MoE model, then mlx_fp4.distributed.quantize with
    global scales: expert bytes and per-expert amaxes of convert-then-shard, same logits."""
    _assert_ok(ranks, "moe_shard_then_convert")


def test_moe_splits_that_cannot_be_exact_raise(ranks):
    """Experts with K off the 16-element blocks through shard_model, and per-expert global
    scales split along the experts by plain model.shard() (MLX's shard_inplace) on an mlx-lm
    nvfp4 model: ValueErrors naming the layer, the same on every rank."""
    res = _assert_ok(ranks, "moe_errors")
    assert res[0]["detail"] == res[1]["detail"]


def test_mxfp4_sharded_layers_match_reference(ranks):
    """MXFP4 (E8M0 per 32, no global scale): all-to-sharded (rows, bias fused), sharded-to-all
    (K split on 32-element blocks, segments 2, all_sum), from MLX's own mxfp4 QuantizedLinear,
    shard_inplace; vs the float64 reference of the unsharded bytes."""
    _assert_ok(ranks, "mxfp4_layers")


def test_mxfp4_k_off_32_blocks_raises_on_every_rank(ranks):
    res = _assert_ok(ranks, "mxfp4_k_block_errors")
    assert res[0]["detail"] == res[1]["detail"], "every rank must raise the same error"


def test_sharded_mxfp4_llama_logits_match_unsharded(ranks):
    _assert_ok(ranks, "mxfp4_model")


def test_mxfp4_shard_first_then_convert(ranks):
    _assert_ok(ranks, "mxfp4_shard_then_convert")
