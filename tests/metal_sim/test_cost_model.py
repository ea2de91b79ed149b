"""The Metal cost model (costmodel.py, benchmarks/results/metal/cost_model.json): the committed
numbers are what the counting builds give today (a few grid points recomputed, both modes), the
rows have the schema of issue 15 (plus the mode), and the targets hold on the whole grid."""

import json
from pathlib import Path

import pytest

import costmodel as cm
from simcheck import require_toolchain

JSON = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "metal" / "cost_model.json"
ROWS = json.loads(JSON.read_text())
NUMBERS = ["instructions_per_weight", "device_bytes_per_weight",
           "threadgroup_bytes_per_weight", "barriers_per_1k_weights"]


def committed(impl, m, n, k, mode="nvfp4"):
    (row,) = [r for r in ROWS if (r["impl"], r["mode"], r["m"], r["n"], r["k"]) == (impl, mode, m, n, k)]
    return row


def test_rows_have_the_issue_schema():
    assert len(ROWS) == 2 * len(cm.MODES) * len(cm.GRID_M) * len(cm.GRID_NK)
    for r in ROWS:
        assert list(r) == cm.ROW_KEYS
        assert r["impl"] in ("mlx_fp4", "mlx") and isinstance(r["kernel"], str)
        assert r["mode"] in cm.MODES
        assert all(isinstance(r[key], float) and r[key] >= 0 for key in NUMBERS)


@pytest.mark.parametrize("m,mode", [(1, "nvfp4"), (8, "nvfp4"), (64, "nvfp4"), (1, "mxfp4"),
                                    (64, "mxfp4")])
def test_committed_numbers_are_reproduced(tmp_path, m, mode):
    """Recomputes grid points at 4096 x 4096: a kernel change without a new
    `python tests/metal_sim/costmodel.py` fails here."""
    require_toolchain()
    rows, _ = cm.compute(grid_m=[m], grid_nk=[(4096, 4096)], work=tmp_path, log=lambda s: None,
                         modes=[mode])
    for row in rows:
        want = committed(row["impl"], m, 4096, 4096, mode)
        assert row["kernel"] == want["kernel"]
        for key in NUMBERS:
            assert row[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), (row, want)


def pairs():
    for r in ROWS:
        if r["impl"] == "mlx_fp4":
            yield r, committed("mlx", r["m"], r["n"], r["k"], r["mode"])


def test_vector_path_needs_fewer_instructions_than_mlx():
    for ours, mlx in pairs():
        if ours["kernel"].startswith("gemv"):
            assert ours["instructions_per_weight"] <= mlx["instructions_per_weight"], (ours, mlx)


def test_gemm_needs_less_than_mlx_from_m_64():
    # instructions + threadgroup traffic (bytes) per weight, where we do not route to MLX
    for ours, mlx in pairs():
        if ours["m"] >= 64:
            cost = lambda r: r["instructions_per_weight"] + r["threadgroup_bytes_per_weight"]  # noqa: E731
            assert cost(ours) <= cost(mlx), (ours, mlx)
