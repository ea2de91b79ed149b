"""The command line as a newcomer meets it, run as a subprocess (the installed ``mlx-fp4`` script when
there is one, else ``python -m mlx_fp4``): bad options and missing folders are one-line errors,
mxfp4 and no-quantize conversions write the right config, the model's own quant_predicate is
followed, and --version / --help say what they should."""

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

import mlx_fp4
from mlx_fp4 import nn as fnn

pytest.importorskip("mlx_lm")
from common import package_pythonpath  # noqa: E402
from lm_fixtures import read_json, write_float_model, write_tokenizer  # noqa: E402
from test_moe_e2e import MODELS, build  # noqa: E402

TIMEOUT_S = 300


def run_cli(*args):
    """(return code, stdout, stderr) of the mlx-fp4 command importing this process's mlx_fp4."""
    script = Path(sys.executable).parent / "mlx-fp4"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "mlx_fp4"]
    env = dict(os.environ, PYTHONPATH=package_pythonpath())
    r = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    return r.returncode, r.stdout, r.stderr


def one_line_error(r, code, text):
    rc, _, err = r
    lines = err.strip().splitlines()
    assert rc == code and len(lines) == 1 and text in lines[0], r


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("float-model")
    write_float_model(folder, seed=5)
    return folder


@pytest.mark.parametrize("option,value,expected", [
    ("--max-tokens", -5, "--max-tokens expected a positive integer but got -5"),
    ("--max-tokens", 0, "--max-tokens expected a positive integer but got 0"),
    ("--prompt", "", "--prompt expected non-empty text but got ''"),
    ("--temp", -1, "--temp expected a number >= 0 (0: greedy) but got -1.0"),
    ("--top-p", 2, "--top-p expected a number in (0, 1] but got 2.0"),
])
def test_generate_refuses_bad_options(source, option, value, expected):
    one_line_error(run_cli("generate", "--model", source, option, value), 2, expected)


@pytest.mark.parametrize("command", ["convert --hf-path", "generate --model"])
def test_missing_local_folder_is_not_a_network_error(tmp_path, command):
    missing = tmp_path / "no-such-model"
    r = run_cli(*command.split(), missing)
    one_line_error(r, 1, f"{str(missing)!r}: no such file or folder")
    assert "internet" not in r[2] and "HFValidationError" not in r[2]


def test_mxfp4_and_float_conversions_write_their_config(source, tmp_path):
    rc, out, err = run_cli("convert", "--hf-path", source, "--mlx-path", tmp_path / "mx", "-q", "--q-mode", "mxfp4")
    assert rc == 0, err
    assert "converted 15 layers to MXFP4" in out
    q = read_json(tmp_path / "mx" / "config.json")["quantization"]
    assert q == {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    model, _ = mlx_fp4.load(str(tmp_path / "mx"))
    assert model.model.layers[0].mlp.up_proj.mode == "mxfp4"

    rc, out, err = run_cli("convert", "--hf-path", source, "--mlx-path", tmp_path / "float")
    assert rc == 0, err
    assert "No layer is quantized" in out
    cfg = read_json(tmp_path / "float" / "config.json")
    assert "quantization" not in cfg and "quantization_config" not in cfg


def test_convert_follows_the_models_quant_predicate(tmp_path):
    """Qwen3-MoE's quant_predicate keeps the router mlp.gate at 8 bits (affine, group 64), as
    mlx_lm.convert -q does; the experts and attention become FP4 layers."""
    from mlx_lm.utils import save_config, save_model

    src = tmp_path / "moe"
    save_model(src, build("qwen3_moe", seed=3))
    save_config(dict(MODELS["qwen3_moe"]), src / "config.json")
    write_tokenizer(src, MODELS["qwen3_moe"]["vocab_size"])
    rc, out, err = run_cli("convert", "--hf-path", src, "--mlx-path", tmp_path / "fp4", "-q")
    assert rc == 0, err
    assert "kept model.layers.0.mlp.gate: MLX affine, 8 bits, group 64: the model's quant_predicate" in out
    q = read_json(tmp_path / "fp4" / "config.json")["quantization"]
    assert q["mode"] == "nvfp4" and q["model.layers.1.mlp.gate"] == {"group_size": 64, "bits": 8, "mode": "affine"}
    model, _ = mlx_fp4.load(str(tmp_path / "fp4"))
    layer = model.model.layers[1].mlp
    assert (layer.gate.mode, layer.gate.bits, layer.gate.group_size) == ("affine", 8, 64)
    assert isinstance(layer.switch_mlp.up_proj, fnn.FP4SwitchLinear)
    assert isinstance(model.model.layers[1].self_attn.q_proj, fnn.FP4Linear)


def test_version_and_help():
    rc, out, _ = run_cli("--version")
    assert rc == 0 and out.startswith(f"mlx-fp4 {mlx_fp4.__version__} (mlx {mx.__version__}, GPU backend: ")
    rc, out, _ = run_cli("generate", "--help")
    assert rc == 0 and "generate with mlx-lm's loop" in out and "(default: 100)" in out
    assert "nucleus sampling" in out and "(default: 1.0)" in out and "(default: 0.0)" in out
    assert "(default: None)" not in out and "(default: False)" not in out
    rc, out, _ = run_cli("bench", "--help")
    assert rc == 0 and out.startswith("usage: mlx-fp4 bench")


def test_requantizing_counts_the_kept_global_scales(capsys):
    """global_scale=False on a model that already has FP4 layers with global scales keeps them, and
    the summary says so (it said '0 with a global scale')."""
    model = build("qwen3_moe", seed=1)
    first = fnn.quantize(model, global_scale=True, progress=False)
    again = fnn.quantize(model, global_scale=False)
    assert again.with_global_scale == first.with_global_scale > 0
    assert f"({first.with_global_scale} with a global scale)" in capsys.readouterr().out


def test_import_without_mlx_backend_says_what_to_install(tmp_path):
    """Linux `pip install .` without [cpu]: mlx's core cannot find libmlx.so (simulated by an mlx
    portion first on the path whose core fails the same way)."""
    fake = tmp_path / "mlx"
    fake.mkdir()
    (fake / "core.py").write_text('raise ImportError("libmlx.so: cannot open shared object file")\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), package_pythonpath()]))
    r = subprocess.run([sys.executable, "-c", "import mlx_fp4"], capture_output=True, text=True, env=env,
                       timeout=TIMEOUT_S)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "libmlx.so" in last and 'pip install "mlx[cpu]==0.32.4"' in last, r.stderr
    assert 'pip install ".[cpu]"' in last


def test_bench_header_knows_the_built_commit(monkeypatch):
    """An installed package is outside any git tree: the bench reports the commit it was built from."""
    from mlx_fp4 import _build_info
    from mlx_fp4.bench import report

    monkeypatch.setattr(report, "_git", lambda *args: None)
    monkeypatch.setattr(_build_info, "GIT_COMMIT", "0123456789abcdef", raising=False)
    info = report.system_info("cpu")
    assert info["git"] == {"commit": "0123456789abcdef", "dirty": None}


def test_export_function_lowers_the_ops(tmp_path):
    """mx.export_function fails on mx_fp4's primitives inside MLX; mx_fp4.export_function writes a file
    that mx.import_function runs with the same result."""
    w = mx.random.normal((32, 64), key=mx.random.key(0))
    packed, scales = mlx_fp4.quantize(w)
    x = mx.random.normal((2, 64), key=mx.random.key(1))

    def fun(x):
        return mlx_fp4.w4a16_matmul(x, packed, scales)

    with pytest.raises(ValueError, match="Unable to serialize primitive"):
        mx.export_function(str(tmp_path / "plain.mlxfn"), fun, x)
    mlx_fp4.export_function(str(tmp_path / "f.mlxfn"), fun, x)
    (got,) = mx.import_function(str(tmp_path / "f.mlxfn"))(x)
    assert mx.allclose(got, fun(x), rtol=1e-5, atol=1e-5).item()
