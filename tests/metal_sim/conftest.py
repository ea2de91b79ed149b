"""metal_sim fixtures: the runner (the production MSL compiled for the CPU), built once per
session and cached on disk (see simbuild.py).

Needs clang++-19 and cmake. Without them the tests are skipped, except on a Linux CI machine
(CI set), where they fail: that is where the Metal kernels are proven.
"""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simbuild  # noqa: E402


def require_toolchain():
    cxx = os.environ.get("METAL_SIM_CXX") or "clang++-19"
    missing = [t for t in (cxx, "cmake") if shutil.which(t) is None]
    if missing:
        msg = (f"metal_sim needs {' and '.join(missing)} "
               "(Debian/Ubuntu: apt-get install -y clang-19 cmake)")
        if os.environ.get("CI") and sys.platform.startswith("linux"):
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def sim_runner():
    """Runner with every kernel specialization eval_gpu can request."""
    require_toolchain()
    return simbuild.build_runner()


@pytest.fixture(scope="session")
def embedded_msl(tmp_path_factory):
    require_toolchain()
    return simbuild.embedded_msl(tmp_path_factory.mktemp("embed"))
