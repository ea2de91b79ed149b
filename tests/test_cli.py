"""mlx-fp4 convert / generate / bench on a tiny random model (no downloads)."""

import importlib.metadata
import subprocess
import sys

import pytest

import mlx_fp4 as mx_fp4
from mlx_fp4 import cli
from mlx_fp4 import nn as fnn

pytest.importorskip("mlx_lm")
from lm_fixtures import PROMPT, read_json, write_float_model  # noqa: E402


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("float-model")
    write_float_model(folder, seed=3)
    return folder


def test_entry_points():
    scripts = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("mlx-fp4") == "mlx_fp4.cli:main"
    out = subprocess.run([sys.executable, "-m", "mlx_fp4", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "convert" in out.stdout and "generate" in out.stdout


def test_convert_then_generate(source, tmp_path, capsys):
    out = tmp_path / "fp4"
    assert cli.main(["convert", "--hf-path", str(source), "--mlx-path", str(out), "-q",
                     "--quant-predicate", "skip-lm-head", "--global-scale", "false"]) == 0
    log = capsys.readouterr().out
    assert "converted 14 layers" in log and "kept lm_head" in log
    assert read_json(out / "config.json")["quantization"]["mode"] == "nvfp4"
    assert (out / "tokenizer.json").exists()
    model, _ = mx_fp4.load(str(out))
    assert isinstance(model.model.layers[1].mlp.down_proj, fnn.FP4Linear)
    assert type(model.lm_head).__name__ == "Linear"
    assert cli.main(["generate", "--model", str(out), "--prompt", PROMPT, "--max-tokens", "5"]) == 0
    log = capsys.readouterr().out
    assert "tokens-per-sec" in log and "Peak memory" in log


def test_convert_refuses_other_modes_and_upload(source, tmp_path, capsys):
    for extra, match in [(["--q-bits", "8"], "bits expected 4"), (["--q-mode", "affine"], "mode expected 'nvfp4'"),
                         (["--upload-repo", "me/model"], "uploading is off"),
                         (["--quant-predicate", "mixed_3_6"], "--quant-predicate expected")]:
        code = cli.main(["convert", "--hf-path", str(source), "--mlx-path", str(tmp_path / "x"), "-q", *extra])
        assert code == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_bench_delegates(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0 and "usage: mlx-fp4 bench" in capsys.readouterr().out
