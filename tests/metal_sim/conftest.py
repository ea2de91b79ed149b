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
