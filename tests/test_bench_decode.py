"""The end-to-end decode benchmark (python -m mlx_fp4.bench decode) on a CI-sized Llama on the CPU:
every variant runs in its own process, reports positive tok/s and its graph nodes per decode step,
FP4Linear on MLX nvfp4's bytes decodes the same greedy tokens as MLX's nvfp4 layers, and the default
path (mlx_fp4.nn.quantize of the dense model) reads those bytes plus its global scales."""

import json
import sys
import time

import pytest

pytest.importorskip("mlx_lm")
from mlx_fp4.bench import decode  # noqa: E402


@pytest.fixture(scope="module")
def tiny_doc(tmp_path_factory):
    """One run of every variant (each in its own process) on the tiny Llama, shared by the tests."""
    out = tmp_path_factory.mktemp("decode")
    rc = decode.main(["--preset", "tiny", "--layers", "2", "--prompt", "6", "--tokens", "6", "--repeats", "1",
                      "--device", "cpu", "--out", str(out), "--no-plot"])
    assert rc == 0
    doc = json.loads((out / "decode_tiny_cpu.json").read_text())
    doc["md_text"] = (out / "decode_tiny_cpu.md").read_text()
    return doc


def test_tiny_decode_all_variants(tiny_doc):
    doc = tiny_doc
    (point,) = doc["points"]
    dense_variants = set(decode.VARIANTS) - {decode.EXPERT_FLOOR}  # the expert floor needs expert layers
    assert set(point["variants"]) == dense_variants
    pids = {r["pid"] for r in doc["raw"]}
    assert len(pids) == len(dense_variants)  # one process per variant
    for r in doc["raw"]:  # each timed run says when it ran (to line it up with GPU samples) and how long
        (run,) = r["runs"]
        assert time.time() - 3600 < run["started_unix_s"] < time.time()
        assert run["seconds"] > 0
    assert decode.SPREAD_NOTE in doc["md_text"]  # ... so the report says what its ratios carry
    for name, v in point["variants"].items():
        assert v["decode_tok_s"]["median"] > 0 and v["prefill_tok_s"]["median"] > 0, name
        assert len(v["tokens"]) == 6
    q = point["variants"]["mlx_nvfp4"]
    assert point["variants"]["dense"]["weight_bytes_per_step"] > 3 * q["weight_bytes_per_step"]
    # affine 4-bit at group 64 (bf16 scale + bias) reads as many bytes as nvfp4 (E4M3 scale per 16)
    assert point["variants"]["affine4"]["weight_bytes_per_step"] == q["weight_bytes_per_step"]
    same = point["variants"]["fp4_same_bytes"]
    assert same["weight_bytes_per_step"] == q["weight_bytes_per_step"]  # the very bytes
    assert same["first_token_difference_vs_mlx_nvfp4"] is None
    assert same["notes"]["quantize"]["with_global_scale"] == 0
    linears = 7 * 2 + 1
    for name in ("fp4", "fp4_fused", "fp4_qkv"):  # the default path: a float32 global scale where it helps
        v = point["variants"][name]
        gs = v["notes"]["quantize"]["with_global_scale"]
        assert v["notes"]["quantize"]["converted"] == linears and 0 <= gs <= linears, name
        extra = v["weight_bytes_per_step"] - q["weight_bytes_per_step"]  # fused QKV: one scale for three
        assert (extra == 4 * gs) if name != "fp4_qkv" else (0 <= extra <= 4 * gs), name
        # not MLX's bytes where a global scale was kept: greedy tokens may part from MLX nvfp4's
        assert "step" in v["vs_mlx_nvfp4"], name


def test_every_variant_reports_nodes_per_step(tiny_doc):
    """nodes per decode step (and per layer) in the JSON of every variant and in the summary table,
    with decode ratios to both references (MLX nvfp4, MLX affine 4-bit)."""
    (point,) = tiny_doc["points"]
    md = tiny_doc["md_text"]
    assert tiny_doc["variants"] == {v: decode.LABELS[v] for v in tiny_doc["config"]["variants"]}
    for name, e in point["variants"].items():
        assert e["nodes_per_step"] == e["graph"]["step"]["nodes"] > 0, name
        assert e["nodes_per_layer"] == e["graph"]["nodes_per_layer"] > 0, name
        row = next(ln for ln in md.splitlines() if ln.startswith(f"| 2 | {decode.LABELS[name]} | ")
                   and ln.endswith(f" | {e['nodes_per_step']} | {e['nodes_per_layer']} | "
                                   f"{e['weight_bytes_per_step'] / 1e6:.4g} |"))
        for ref in decode.REFERENCES:
            if name == ref:
                assert f"decode_x_{ref}" not in e
                continue
            x = e["decode_tok_s"]["median"] / point["variants"][ref]["decode_tok_s"]["median"]
            assert e[f"decode_x_{ref}"] == pytest.approx(x), (name, ref)
            assert f"{x:.2f}x" in row, (name, ref)


def test_prefill_table(tiny_doc):
    """Both prefill numbers per run (mlx-lm's time-to-first-token one and the forward alone), and the
    report's prefill rows carry their medians and the ratios to MLX nvfp4 and dense from the JSON."""
    (point,) = tiny_doc["points"]
    for r in tiny_doc["raw"]:
        (run,) = r["runs"]
        assert run["prefill_forward_tok_s"] > 0 and run["prefill_tok_s"] > 0
    vs = point["variants"]
    for name in decode.OURS:
        fwd, ref = vs[name]["prefill_forward_tok_s"]["median"], vs["dense"]["prefill_forward_tok_s"]["median"]
        row = next(ln for ln in tiny_doc["md_text"].splitlines() if ln.startswith(f"| 2 | {decode.LABELS[name]} |")
                   and "x dense" in ln)
        assert f"{fwd:.0f} (" in row and f"{fwd / ref:.2f}x dense" in row, row


def test_per_process_table(tiny_doc):
    """The report lists each process's decode median per variant (the spread a ratio carries), with
    the host CPU it ran on where Linux says; on the CPU there is no GPU state to read."""
    (point,) = tiny_doc["points"]
    assert "| layers | variant | per process" in tiny_doc["md_text"]
    for name, v in point["variants"].items():
        (med,) = v["per_process_decode_median"]
        (hs,) = v["per_process_host_state"]
        assert v["per_process_gpu_state"] == [{"before_runs": None, "after_runs": None}], name
        cell = decode._host_cell(hs)
        assert f"| 2 | {decode.LABELS[name]} | {med:.0f}{cell} |" in tiny_doc["md_text"], name
        if sys.platform.startswith("linux"):  # /proc and sched_getaffinity exist
            after, before = hs["after_runs"], hs["before_runs"]
            assert after["cpu"] in parse_cpus(after["affinity"]), name
            assert after["involuntary_switches"] >= before["involuntary_switches"] >= 0, name
            assert cell.startswith(f" [cpu {after['cpu']}"), name


def parse_cpus(text):
    """'0-3' or '0,2,5' -> the set of CPU numbers."""
    if "-" in text:
        lo, hi = map(int, text.split("-"))
        return set(range(lo, hi + 1))
    return {int(c) for c in text.split(",")}


def test_host_state_reads_proc(monkeypatch):
    """cpu_facts.host_state parses /proc/self/stat's processor field (past a command name holding ') '),
    /proc/self/status's context switches and cpufreq's kHz; a missing file gives None, not a guess."""
    from mlx_fp4.bench import cpu_facts

    fields = ["S"] + [str(i) for i in range(1, 60)]  # after ")": state, then fields 4.. of proc(5)
    fields[cpu_facts._STAT_PROCESSOR_FIELD] = "7"
    files = {
        "/proc/self/stat": "123 (a) b) " + " ".join(fields),
        "/proc/self/status": "Name:\tx\nvoluntary_ctxt_switches:\t40\nnonvoluntary_ctxt_switches:\t3\n",
        "/sys/devices/system/cpu/cpu7/cpufreq/scaling_cur_freq": "2450000\n",
    }
    monkeypatch.setattr(cpu_facts, "_read", lambda path: files.get(path))
    monkeypatch.setattr(cpu_facts.os, "sched_getaffinity", lambda pid: {4, 5, 6, 7}, raising=False)
    assert cpu_facts.host_state() == {"affinity": "4-7", "cpu": 7, "cpu_mhz": 2450, "voluntary_switches": 40,
                                   "involuntary_switches": 3}
    del files["/sys/devices/system/cpu/cpu7/cpufreq/scaling_cur_freq"]
    files["/proc/cpuinfo"] = "processor\t: 6\ncpu MHz\t\t: 1000.0\n\nprocessor\t: 7\ncpu MHz\t\t: 3100.4\n"
    assert cpu_facts.host_state()["cpu_mhz"] == 3100
    files.clear()
    monkeypatch.setattr(cpu_facts.os, "sched_getaffinity", lambda pid: {0, 2}, raising=False)
    assert cpu_facts.host_state() == {"affinity": "0,2", "cpu": None, "cpu_mhz": None, "voluntary_switches": None,
                                   "involuntary_switches": None}


def test_gpu_state_parses_nvidia_smi(monkeypatch):
    import subprocess

    from mlx_fp4.bench import report

    def fake(stdout, rc=0):
        return lambda *a, **k: subprocess.CompletedProcess(a, rc, stdout=stdout, stderr="")

    monkeypatch.setattr(report.subprocess, "run", fake("1980, 3201, 41, 312.52, 0x0000000000000000\n"))
    assert report.gpu_state() == dict(zip(report.GPU_STATE_FIELDS, ["1980", "3201", "41", "312.52",
                                                                     "0x0000000000000000"]))
    monkeypatch.setattr(report.subprocess, "run", fake("1980, 3201\n"))  # fields missing: not guessed
    assert report.gpu_state() is None
    monkeypatch.setattr(report.subprocess, "run", fake("", rc=9))
    assert report.gpu_state() is None

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(report.subprocess, "run", missing)
    assert report.gpu_state() is None


def test_bad_arguments_are_rejected():
    with pytest.raises(SystemExit):
        decode.main(["--preset", "tiny", "--repeats", "0", "--device", "cpu"])
    with pytest.raises(SystemExit, match="floor"):  # expert layers would stay dense: no floor
        decode.main(["--preset", "tiny-moe", "--variants", "floor", "--device", "cpu"])
    with pytest.raises(SystemExit, match="expert layers"):  # nothing to replace in a dense model
        decode.main(["--preset", "tiny", "--variants", decode.EXPERT_FLOOR, "--device", "cpu"])
    with pytest.raises(SystemExit, match="--layers expected 30 for the smollm2 preset"):  # a real checkpoint
        decode.main(["--preset", "smollm2", "--layers", "2", "--device", "cpu"])


def test_floor_variant_has_one_node_per_linear(tiny_doc):
    """The floor models (no matmuls) have the node structure of MLX's nvfp4 model (one node per
    linear: QuantizedMatmul there, a trivial kernel or a view here), read no weight bytes, and every
    variant records the step's node count, host profile and per-node costs."""
    (point,) = tiny_doc["points"]
    v = point["variants"]
    mlx_q = v["mlx_nvfp4"]
    for name in decode.FLOORS:
        floor = v[name]
        assert floor["weight_bytes_per_step"] == 0, name
        assert floor["graph"]["nodes_per_layer"] == mlx_q["graph"]["nodes_per_layer"], name
        assert floor["graph"]["step"]["nodes"] == mlx_q["graph"]["step"]["nodes"], name
        prims = floor["graph"]["step"]["by_primitive"]
        assert "QuantizedMatmul" not in prims and "W4A16Matmul" not in prims, name
        # the only matmuls left are attention's (the CPU's attention fallback), as in MLX's model
        assert prims.get("Matmul") == mlx_q["graph"]["step"]["by_primitive"].get("Matmul"), name
    linears = 7 * 2 + 1  # q/k/v/o + gate/up/down per layer, lm_head
    assert v["floor"]["notes"]["floor_linears"] == linears
    prims = v["floor"]["graph"]["step"]["by_primitive"]
    assert prims["GatherAxis"] == linears  # one kernel per linear
    for name, e in v.items():
        g = e["graph"]
        assert g["layers"] == 2 and g["step"]["nodes"] == 2 * g["nodes_per_layer"] + g["nodes_outside_layers"], name
        assert g["nodes_outside_layers"] > 0 and g["step"]["arrays"] > g["step"]["nodes"], name
        prof = e["host_profile"]
        assert all(prof[k] > 0 for k in ("build_ms", "encode_ms", "step_ms")), name
        assert e["host_per_node"]["build_us_per_node"] > 0, name
        for kind in ("kernel", "view"):  # one node per op in both chains
            assert e["node_cost"][kind]["nodes"] == e["node_cost"]["chain_ops"], name
            assert e["node_cost"][kind]["eval_us_per_node"] > 0, name


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("dims", [(64, 16), (64, 64), (64, 256)])
def test_floor_linear_is_one_node_of_the_linear_shape(dims, kernel):
    import mlx.core as mx

    from mlx_fp4.bench.decode_host import FloorLinear, graph_nodes

    k, n = dims
    x = mx.random.normal((1, 1, k)).astype(mx.bfloat16)  # a decode step's activation
    mx.eval(x)
    layer = FloorLinear(k, n, kernel=kernel)
    assert not layer.parameters()
    y = layer(x)
    g = graph_nodes(y)
    assert g["nodes"] == 1
    want = "GatherAxis" if kernel or n > k else ("Slice" if n < k else "Contiguous")
    assert g["by_primitive"] == {want: 1}
    assert y.shape == (1, 1, n) and y.dtype == mx.bfloat16
    # it depends on x: output feature j is x's feature j % k
    assert mx.array_equal(y, x[..., [j % k for j in range(n)]]).item()
    y5 = layer(mx.ones((2, 5, k), mx.bfloat16))  # a prefill-shaped input
    assert y5.shape == (2, 5, n)


def test_expert_floor_replaces_only_the_experts(tmp_path):
    """floor_experts on an MoE model: every SwitchGLU becomes one Gather node of the experts' output
    shape, the rest (FP4Linear attention and lm_head, the router) stays as in the fp4 variant."""
    rc = decode.main(["--preset", "tiny-moe", "--layers", "2", "--prompt", "6", "--tokens", "4", "--repeats", "1",
                      "--variants", "fp4", decode.EXPERT_FLOOR, "--device", "cpu", "--out", str(tmp_path),
                      "--no-plot"])
    assert rc == 0
    (point,) = json.loads((tmp_path / "decode_tiny-moe_cpu.json").read_text())["points"]
    ours, floor = point["variants"]["fp4"], point["variants"][decode.EXPERT_FLOOR]
    assert floor["notes"]["floor_experts"] == 2 and floor["decode_tok_s"]["median"] > 0
    ours_p, floor_p = ours["graph"]["step"]["by_primitive"], floor["graph"]["step"]["by_primitive"]
    assert "GatherW4A16Matmul" in ours_p and "GatherW4A16Matmul" not in floor_p
    assert floor_p["W4A16Matmul"] == ours_p["W4A16Matmul"]  # attention and lm_head: ours in both
    assert floor_p["GatherAxis"] - ours_p.get("GatherAxis", 0) == 2  # one kernel per layer's experts
    assert floor["graph"]["nodes_per_layer"] < ours["graph"]["nodes_per_layer"]
    assert floor["graph"]["nodes_outside_layers"] == ours["graph"]["nodes_outside_layers"]


def test_floor_switch_glu_is_one_node_of_the_experts_shape():
    import mlx.core as mx

    from mlx.utils import tree_flatten

    from mlx_fp4.bench.decode_host import FloorSwitchGLU, graph_nodes

    x = mx.random.normal((1, 1, 64)).astype(mx.bfloat16)
    idx = mx.array([[[3, 5]]], dtype=mx.uint32)
    mx.eval(x, idx)
    y = FloorSwitchGLU(64, 48, 2)(x, idx)
    assert not tree_flatten(FloorSwitchGLU(64, 48, 2).parameters())  # no arrays
    assert graph_nodes(y)["by_primitive"] == {"GatherAxis": 1, "Reshape": 1}  # one kernel, one view
    assert y.shape == (1, 1, 2, 48) and y.dtype == mx.bfloat16
    assert mx.array_equal(y[..., 1, :], x[..., [j % 64 for j in range(48, 96)]]).item()  # depends on x
    assert FloorSwitchGLU(64, 48, 2)(mx.ones((2, 5, 64), mx.bfloat16), None).shape == (2, 5, 2, 48)  # prefill


def _tiny_fp4(fused_qkv: bool):
    """The tiny Llama on MLX nvfp4's bytes (no global scales: every QKV block fuses), SwiGLU fused,
    and QKV fused when asked."""
    from mlx_fp4 import nn as fnn
    from mlx_fp4.bench.decode_qkv import fuse_qkv

    model, notes = decode.build_model("tiny", 2, "fp4_same_bytes", seed=3)
    fnn.fuse_swiglu(model)
    if fused_qkv:
        notes["qkv"] = fuse_qkv(model)
    return model, notes


def test_default_path_qkv_leaves_blocks_with_unequal_global_scales():
    """fp4_qkv builds on mlx_fp4.nn.quantize's default (global_scale="auto"): a block whose q/k/v got
    different global scales stays three FP4Linear, and the notes name it."""
    model, notes = decode.build_model("tiny", 2, "fp4_qkv", seed=3)
    assert notes["quantize"]["with_global_scale"] > 0  # this seed: some layers keep a global scale
    qkv = notes["qkv"]
    assert qkv["fused"] + len(qkv["left_unfused"]) == 2
    for path in qkv["left_unfused"]:
        attn = dict(model.named_modules())[path]
        gs = [getattr(attn, p).get("global_scale") for p in ("q_proj", "k_proj", "v_proj")]
        scales = {None if g is None else float(g.item()) for g in gs}
        assert len(scales) > 1, path


def test_fused_variant_fuses_dense_and_expert_swiglu():
    """fp4_fused fuses what it can and says how many blocks: every dense MLP of a dense model,
    every SwitchGLU of an all-MoE one (fuse_swiglu alone leaves an MoE model unchanged)."""
    from mlx_fp4 import nn as fnn

    for preset, kind in (("tiny", fnn.FP4SwiGLU), ("tiny-moe", fnn.FP4SwitchGLU)):
        model, notes = decode.build_model(preset, 2, "fp4_fused", seed=3)
        assert notes["fused_swiglu"] == 2
        assert sum(isinstance(m, kind) for m in model.modules()) == 2


def test_fused_qkv_gives_the_unfused_logits():
    """One FP4Linear over q|k|v rows (exact: rows are independent) decodes with the very logits of
    three FP4Linear, and takes fewer graph nodes per layer."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_fp4.bench.decode_host import step_graph
    from mlx_fp4.bench.decode_qkv import FusedQProj

    (plain, _), (fused, notes) = _tiny_fp4(False), _tiny_fp4(True)
    assert notes["qkv"] == {"fused": 2, "left_unfused": []}
    assert sum(isinstance(m, FusedQProj) for _, m in fused.named_modules()) == 2
    assert decode.step_weight_bytes(fused) == decode.step_weight_bytes(plain)
    prompt = mx.array([[3, 1, 4, 1, 5, 9]])
    logits = []
    for model in (plain, fused):
        cache = make_prompt_cache(model)
        steps = [model(prompt, cache=cache)]
        for _ in range(3):  # decode steps on the cache (M = 1)
            steps.append(model(mx.argmax(steps[-1][:, -1:, :], axis=-1), cache=cache))
        logits.append([np.array(s.astype(mx.float32)) for s in steps])
    for a, b in zip(*logits):
        np.testing.assert_array_equal(a, b)
    g_plain, g_fused = step_graph(plain, prompt[0]), step_graph(fused, prompt[0])
    assert g_fused["nodes_per_layer"] < g_plain["nodes_per_layer"]
    assert g_fused["step"]["by_primitive"]["Split"] == 2


def test_fused_qkv_parts_are_right_for_any_input():
    """k_proj / v_proj called on an input other than q_proj's compute their own rows (fallback);
    projections with different global scales are left unfused and reported."""
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np

    from mlx_fp4.bench.decode_qkv import fuse_qkv, fuse_qkv_block
    from mlx_fp4.nn import FP4Linear

    mx.random.seed(5)
    lin = [nn.Linear(64, n, bias=False) for n in (32, 16, 16)]
    q, k, v = (FP4Linear.from_linear(m) for m in lin)
    fq, fk, fv = fuse_qkv_block(q, k, v)
    x1, x2 = mx.random.normal((1, 1, 64)), mx.random.normal((1, 1, 64))
    np.testing.assert_array_equal(np.array(fq(x1)), np.array(q(x1)))
    np.testing.assert_array_equal(np.array(fk(x2)), np.array(k(x2)))  # not q's input: fallback
    np.testing.assert_array_equal(np.array(fk(x1)), np.array(k(x1)))
    np.testing.assert_array_equal(np.array(fv(x1)), np.array(v(x1)))
    np.testing.assert_array_equal(np.array(fv(x1)), np.array(v(x1)))  # after v released the parts

    class Attn(nn.Module):
        def __init__(self, gs):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (FP4Linear.from_linear(m, global_scale=g) for m, g in zip(lin, gs))

    block = nn.Module()
    block.same, block.differ = Attn([2.0, 2.0, 2.0]), Attn([2.0, 3.0, 2.0])
    assert fuse_qkv(block) == {"fused": 1, "left_unfused": ["differ"]}
    assert type(block.differ.k_proj) is FP4Linear


def test_interleaved_variants_share_a_process_and_pair_their_rounds(tmp_path):
    """--interleave: every variant of a point in one worker process, each round timing each variant
    once (round r starting at variant r mod n), the same greedy tokens and bytes as separate
    processes would give, and the paired ratio = per-round ratios to MLX nvfp4 from the raw runs."""
    variants = ["mlx_nvfp4", "affine4", "fp4", decode.EXPERT_FLOOR]
    repeats = 3
    rc = decode.main(["--preset", "tiny-moe", "--layers", "2", "--variants", *variants, "--prompt", "6",
                      "--tokens", "6", "--repeats", str(repeats), "--device", "cpu", "--interleave",
                      "--out", str(tmp_path), "--no-plot"])
    assert rc == 0
    doc = json.loads((tmp_path / "decode_tiny-moe_cpu.json").read_text())
    md = (tmp_path / "decode_tiny-moe_cpu.md").read_text()
    assert doc["config"]["interleave"] is True
    assert len({r["pid"] for r in doc["raw"]}) == 1 and all(r["interleaved"] for r in doc["raw"])
    by = {r["variant"]: r for r in doc["raw"]}
    assert sorted(by) == sorted(variants)
    starts = {v: [run["started_unix_s"] for run in r["runs"]] for v, r in by.items()}
    for v, r in by.items():
        assert [run["round"] for run in r["runs"]] == list(range(repeats)), v
    for rnd in range(repeats):  # each round's first run is variant rnd mod n: rotation, no fixed order
        first = min(variants, key=lambda v: starts[v][rnd])
        assert first == variants[rnd % len(variants)], rnd
        if rnd:  # rounds do not overlap
            assert min(starts[v][rnd] for v in variants) > max(starts[v][rnd - 1] for v in variants)
    (point,) = doc["points"]
    # The same greedy tokens as MLX nvfp4, up to a tie in MLX's bf16 log-probabilities (this seed has
    # one at step 4, in separate processes too): there ours is its second choice.
    diff = point["variants"]["fp4"]["vs_mlx_nvfp4"]
    assert diff["step"] is None or (diff["ours_is_reference_second_choice"] and diff["reference_top2_gap"] == 0)
    ref = {run["round"]: run["decode_tok_s"] for run in by["mlx_nvfp4"]["runs"]}
    for ref_name in decode.REFERENCES:
        ref = {run["round"]: run["decode_tok_s"] for run in by[ref_name]["runs"]}
        for v in (x for x in variants if x != ref_name):
            want = sorted(run["decode_tok_s"] / ref[run["round"]] for run in by[v]["runs"])
            got = point["variants"][v][f"paired_vs_{ref_name}"]
            assert got["n"] == repeats and got["min"] == pytest.approx(want[0])
            assert got["max"] == pytest.approx(want[-1]) and got["median"] == pytest.approx(want[repeats // 2])
            assert f"paired {got['median']:.2f}x" in md, v
        assert f"paired_vs_{ref_name}" not in point["variants"][ref_name]
    # the affine layers whose input dims 64 does not divide (the experts' down_proj) take group 32
    assert len(point["variants"]["affine4"]["notes"]["affine_group_32"]) == 2
    for v in variants:  # nodes per step interleaved too, in the JSON and the summary table
        e = point["variants"][v]
        assert e["nodes_per_step"] == by[v]["graph"]["step"]["nodes"] > 0, v
        assert f"| 2 | {decode.LABELS[v]} | " in md and f" | {e['nodes_per_step']} | {e['nodes_per_layer']} | " in md
    assert decode.SPREAD_NOTE not in md  # the note is for one process per variant


def test_separate_processes_have_no_paired_ratio(tiny_doc):
    (point,) = tiny_doc["points"]
    assert all("paired_vs_mlx_nvfp4" not in v for v in point["variants"].values())
    assert all(not r.get("interleaved") for r in tiny_doc["raw"])
