"""The Metal tuner (python/mlx_fp4/tuning.py) driven with fake timings: the decision, persistence,
a corrupt cache file, a changed environment; and the route table it fills in the extension
(csrc/metal_route_table.h), which ops.cpp's metal_route reads. No Apple GPU is needed: the tuner's
logic and the table are plain code; only time_route runs on a device."""

import json

import mlx.core as mx
import pytest

import mlx_fp4 as mx_fp4
from mlx_fp4 import _ext, tuning

ENV = {"gpu": "Apple M4 Max", "arch": "applegpu_g16s", "macos": "15.5", "mlx": "0.32.4",
       "mlx_fp4": "0.1.0", "schema": tuning.SCHEMA}


class FakeTimer:
    """Seconds per call from a table {route: seconds}; records every measurement."""

    def __init__(self, ours, mlx):
        self.t = {"ours": ours, "mlx": mlx}
        self.calls = []

    def __call__(self, m, n, k, dtype, mode, route, experts=0, sorted=False):
        self.calls.append((m, n, k, route) + ((experts, sorted) if experts else ()))
        return self.t[route]


def make(tmp_path, timer, env=ENV):
    applied = []
    return tuning.Tuner(tmp_path / "metal_tuning.json", env, timer, applied.append), applied


@pytest.mark.parametrize("ours,mlx,want", [(1.0, 2.0, "ours"), (2.0, 1.0, "mlx"), (1.0, 1.0, "ours")])
def test_decision_is_the_faster_route(tmp_path, ours, mlx, want):
    timer = FakeTimer(ours, mlx)
    t, applied = make(tmp_path, timer)
    assert t.state == "new"
    assert t.route(16, 4096, 4096, mx.bfloat16, "nvfp4") == want
    assert [c[3] for c in timer.calls] == ["ours", "mlx"]
    assert applied[-1]["route"] == want and applied[-1]["ours_s"] == ours


def test_bucket_is_measured_once(tmp_path):
    timer = FakeTimer(2.0, 1.0)
    t, _ = make(tmp_path, timer)
    for m in (17, 20, 32):  # one bucket (32)
        assert t.route(m, 4096, 4096, mx.bfloat16, "nvfp4") == "mlx"
    assert len(timer.calls) == 2 and timer.calls[0][0] == 32
    t.route(33, 4096, 4096, mx.bfloat16, "nvfp4")  # the next bucket (64)
    t.route(32, 4096, 4096, mx.float16, "nvfp4")   # another dtype
    t.route(32, 4096, 4096, mx.bfloat16, "mxfp4")  # another mode
    assert len(timer.calls) == 8


def test_decisions_persist(tmp_path):
    t, _ = make(tmp_path, FakeTimer(2.0, 1.0))
    t.route(9, 4096, 14336, mx.bfloat16, "nvfp4")
    timer = FakeTimer(1.0, 2.0)  # would decide the other way if it measured again
    t2, applied = make(tmp_path, timer)
    assert t2.state == "loaded" and timer.calls == []
    assert [e["route"] for e in applied] == ["mlx"]  # handed to the op at load
    assert t2.route(9, 4096, 14336, mx.bfloat16, "nvfp4") == "mlx"
    assert timer.calls == []


@pytest.mark.parametrize("text", ["{not json", "[]", '{"environment": {}}',
                                  '{"environment": {}, "decisions": [{"route": "gpu"}]}', ""])
def test_corrupt_cache_is_rebuilt(tmp_path, text):
    (tmp_path / "metal_tuning.json").write_text(text)
    timer = FakeTimer(1.0, 2.0)
    t, applied = make(tmp_path, timer)
    assert t.state == "rebuilt: corrupt" and applied == []
    assert json.loads((tmp_path / "metal_tuning.json").read_text())["decisions"] == []
    assert t.route(1, 4096, 4096, mx.bfloat16, "nvfp4") == "ours" and len(timer.calls) == 2


@pytest.mark.parametrize("field", ["gpu", "macos", "mlx", "mlx_fp4"])
def test_changed_environment_is_retuned(tmp_path, field):
    t, _ = make(tmp_path, FakeTimer(2.0, 1.0))
    t.route(64, 4096, 4096, mx.bfloat16, "nvfp4")
    timer = FakeTimer(1.0, 2.0)
    t2, applied = make(tmp_path, timer, env={**ENV, field: "other"})
    assert t2.state == "re-tuned: environment changed" and applied == []
    assert t2.route(64, 4096, 4096, mx.bfloat16, "nvfp4") == "ours" and len(timer.calls) == 2
    doc = json.loads((tmp_path / "metal_tuning.json").read_text())
    assert doc["environment"][field] == "other" and len(doc["decisions"]) == 1


def test_shape_buckets():
    assert [_ext._metal_shape_bucket(m) for m in (1, 9, 16, 17, 32, 33, 1000)] == \
        [1, 9, 16, 32, 32, 64, 1024]


def test_route_table_in_the_extension():
    _ext._metal_route_clear()
    try:
        assert _ext._metal_route_get(20, 64, 128, mx.bfloat16, "nvfp4") is None
        _ext._metal_route_set(20, 64, 128, mx.bfloat16, "nvfp4", "mlx")
        assert _ext._metal_route_get(30, 64, 128, mx.bfloat16, "nvfp4") == "mlx"  # same bucket
        assert _ext._metal_route_get(30, 64, 128, mx.float16, "nvfp4") is None
        assert _ext._metal_route_entries() == [(32, 64, 128, "bfloat16", "nvfp4", 0, False, "mlx")]
        # the gathered op's keys are apart: experts and the sorted hint
        assert _ext._metal_route_get(30, 64, 128, mx.bfloat16, "nvfp4", experts=8) is None
        _ext._metal_route_set(30, 64, 128, mx.bfloat16, "nvfp4", "ours", experts=8, sorted=True)
        assert _ext._metal_route_get(20, 64, 128, mx.bfloat16, "nvfp4", experts=8, sorted=True) == "ours"
        assert _ext._metal_route_get(20, 64, 128, mx.bfloat16, "nvfp4", experts=8) is None
        _ext._metal_route_set(30, 64, 128, mx.bfloat16, "nvfp4", None, experts=8, sorted=True)
        _ext._metal_route_set(20, 64, 128, mx.bfloat16, "nvfp4", None)
        assert _ext._metal_route_entries() == []
        with pytest.raises(ValueError, match="ours, mlx or cpu"):
            _ext._metal_route_set(20, 64, 128, mx.bfloat16, "nvfp4", "gpu")
    finally:
        _ext._metal_route_clear()


@pytest.mark.parametrize("arch,m,want", [
    ("applegpu_g12x", 64, "cpu"),   # before Apple7 (e.g. a paravirtual GPU): the CPU
    ("applegpu_g16s", 64, "ours"),  # M4: ours at every M (the cost model)
    ("applegpu_g17s", 8, "ours"),   # M5 below MLX's batch limit (25 at 4096^2): MLX's GEMV
    ("applegpu_g17s", 24, "ours"),
    ("applegpu_g17s", 25, "mlx"),   # MLX's NAX kernel
])
def test_static_route(arch, m, want):
    assert _ext._metal_static_route(arch, m, 4096, 4096, mx.bfloat16) == want
    if want == "mlx":
        assert _ext._metal_static_route(arch, m, 4096, 4096, mx.float32) == "ours"  # NAX: no fp32


def test_off_and_inactive_without_an_apple_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv(tuning.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setenv(tuning.ENV_TUNE, "0")
    assert not tuning.active()
    assert mx_fp4.metal_tuning()["enabled"] is False
    monkeypatch.delenv(tuning.ENV_TUNE)
    if not mx.metal.is_available():
        assert not tuning.active()
        x = mx.ones((3, 64))
        w = mx.zeros((8, 32), dtype=mx.uint8)
        s = mx.full((8, 4), 0x38, dtype=mx.uint8)
        mx_fp4.w4a16_matmul(x, w, s)  # no measurement, no cache file
        assert not (tmp_path / tuning.CACHE_FILE).exists()
    assert mx_fp4.metal_tuning()["path"] == str(tmp_path / tuning.CACHE_FILE)


def test_kernel_names_follow_the_dispatch_table():
    """The name metal-report prints per row (our dispatch, csrc/metal/w4a16_dispatch.h): the
    vector path to M = 16, the 64-row GEMM (split-K on few tiles) below 256, the 128-row one."""
    names = {m: _ext._metal_kernel(m, 4096, 4096, mx.bfloat16) for m in (1, 9, 16, 17, 256)}
    assert names[1].startswith("mlx_fp4_w4a16_gemv_mt1_") and "gemv_mt16" in names[9]
    assert "gemv_mt16" in names[16] and "gemm_bm64" in names[17] and "splitk" in names[17]
    assert "gemm_bm128" in names[256] and "splitk" not in names[256]


def test_a_failed_measurement_keeps_the_static_route(monkeypatch, tmp_path, capsys):
    """Inside mx.compile's trace the timing cannot evaluate: the call keeps the static route,
    nothing is recorded, a later call measures again. The hook ops.w4a16_matmul runs, with the
    shape it derives (M = rows of x over its batch dims, N = weight rows, K)."""
    seen = []

    def failing(m, n, k, dtype, mode, route, experts=0, sorted=False):
        seen.append((m, n, k, mode))
        raise ValueError("[eval] Attempting to eval an array during function transformations")

    t, applied = make(tmp_path, failing)
    monkeypatch.setattr(tuning, "active", lambda: True)
    monkeypatch.setattr(tuning, "tuner", lambda: t)
    x = mx.zeros((2, 3, 64), dtype=mx.bfloat16)
    w = mx.zeros((8, 32), dtype=mx.uint8)
    tuning.before_matmul(x, w, "nvfp4", mx.gpu)
    assert seen == [(6, 8, 64, "nvfp4")] and t.table() == [] and applied == []
    assert "static route" in capsys.readouterr().err
    tuning.before_matmul(x, w, "nvfp4", mx.cpu)  # a CPU stream: nothing to route
    tuning.before_matmul(x[..., :40], w, "nvfp4", mx.gpu)  # K % 16 != 0: no MLX kernel to compare
    monkeypatch.setenv(tuning.ENV_ROUTE, "ours")  # a forced route: nothing to measure
    tuning.before_matmul(x, w, "nvfp4", mx.gpu)
    assert len(seen) == 1


def test_gathered_op_is_tuned_per_experts_and_hint(tmp_path):
    timer = FakeTimer(2.0, 1.0)
    t, applied = make(tmp_path, timer)
    assert t.route(512, 768, 2048, mx.bfloat16, "nvfp4", 128, True) == "mlx"
    assert t.route(512, 768, 2048, mx.bfloat16, "nvfp4") == "mlx"  # the dense op: another entry
    t.route(400, 768, 2048, mx.bfloat16, "nvfp4", 128, True)      # same bucket (512)
    t.route(512, 768, 2048, mx.bfloat16, "nvfp4", 128, False)     # no hint: another entry
    assert len(timer.calls) == 6 and timer.calls[0] == (512, 768, 2048, "ours", 128, True)
    assert [(e["experts"], e["sorted"]) for e in applied] == [(128, True), (0, False), (128, False)]
    t2, _ = make(tmp_path, FakeTimer(1.0, 2.0))
    assert t2.state == "loaded" and t2.route(512, 768, 2048, mx.bfloat16, "nvfp4", 128, True) == "mlx"


def test_gather_hook_keys_like_the_op(monkeypatch, tmp_path):
    """before_gather derives what gather_ops.cpp keys on: all pairs' rows (the indices' broadcast
    shape times x's rows), N, K, the experts, the hint only with rhs and without lhs."""
    timer = FakeTimer(1.0, 2.0)
    t, _ = make(tmp_path, timer)
    monkeypatch.setattr(tuning, "active", lambda: True)
    monkeypatch.setattr(tuning, "tuner", lambda: t)
    x = mx.zeros((24, 1, 1, 64), dtype=mx.bfloat16)  # mlx-lm's SwitchGLU layout: [B, 1, 1, K]
    w = mx.zeros((8, 16, 32), dtype=mx.uint8)
    rhs = mx.zeros((24, 2), dtype=mx.uint32)
    lhs = mx.zeros((24, 1), dtype=mx.uint32)
    tuning.before_gather(x, w, None, rhs, True, "nvfp4", mx.gpu)
    tuning.before_gather(x, w, lhs, rhs, True, "nvfp4", mx.gpu)  # lhs given: the hint does not hold
    assert timer.calls[0] == (64, 16, 64, "ours", 8, True) and timer.calls[2] == (64, 16, 64, "ours", 8, False)
    tuning.before_gather(x[:3], w, None, rhs, True, "nvfp4", mx.gpu)  # does not broadcast: the op raises
    assert len(timer.calls) == 4
