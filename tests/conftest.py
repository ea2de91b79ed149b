"""pytest setup: the `device` fixture (cpu always, gpu when MLX has one).

MLX_FP4_TEST_DEVICES=cpu,gpu (comma list) overrides which devices are tried; a requested gpu
that MLX does not have is skipped with the reason.
"""

import os

# MLX's CUDA float32 matmul defaults to TF32, which would make the fp32 references and vjp checks
# off by ~1e-3 on NVIDIA GPUs; the tests compare against full fp32.
os.environ.setdefault("MLX_ENABLE_TF32", "0")
# The Metal tuner (mlx_fp4.tuning) would time every new shape of the suite on a Mac and write to the
# user's cache: off for the suite; test_metal_gpu.py turns it on with a temporary cache.
os.environ.setdefault("MLX_FP4_METAL_TUNE", "0")

import mlx.core as mx  # noqa: E402
import pytest


def gpu_available():
    if mx.metal.is_available():
        return True
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


def _device_names():
    env = os.environ.get("MLX_FP4_TEST_DEVICES")
    if env:
        return [d.strip() for d in env.split(",") if d.strip()]
    return ["cpu", "gpu"]


@pytest.fixture(params=_device_names())
def device(request):
    """Run the test with this device as MLX's default; yields the mx.Device."""
    name = request.param
    if name == "gpu":
        if not gpu_available():
            pytest.skip("no GPU: mx.metal and mx.cuda are not available")
        dev = mx.gpu
    elif name == "cpu":
        dev = mx.cpu
    else:
        raise ValueError(f"MLX_FP4_TEST_DEVICES: unknown device {name!r}")
    old = mx.default_device()
    mx.set_default_device(dev)
    try:
        yield dev
    finally:
        mx.set_default_device(old)
