"""metal_sim fixtures: the runner (the production MSL compiled for the CPU), built once per
session and cached on disk (see simbuild.py).

Needs clang++-19 and cmake. Without them the tests are skipped, except on a Linux CI machine
(CI set), where they fail: that is where the Metal kernels are proven.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simbuild  # noqa: E402
from simcheck import require_toolchain  # noqa: E402


@pytest.fixture(scope="session")
def sim_runner():
    """Runner with every kernel specialization eval_gpu can request."""
    require_toolchain()
    return simbuild.build_runner()


@pytest.fixture(scope="session")
def embedded_msl(tmp_path_factory):
    require_toolchain()
    return simbuild.embedded_msl(tmp_path_factory.mktemp("embed"))


@pytest.fixture(scope="session")
def mlx_runner():
    """Runner with MLX 0.32.4's own nvfp4 kernels (mlx_kernels.py). Skips when the wheel cannot
    be downloaded, except on CI, where it fails."""
    require_toolchain()
    import mlx_kernels

    try:
        return mlx_kernels.build_runner()
    except mlx_kernels.Unavailable as e:
        if os.environ.get("CI"):
            pytest.fail(str(e))
        pytest.skip(str(e))
