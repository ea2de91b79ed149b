"""The extension shares MLX's C++ runtime (Linux).

MLX's own module translates the C++ exceptions _ext throws (nanobind domain "mlx"), so _ext must load
the shared libstdc++ that libmlx loads, not carry a private static copy: with a copy, every ValueError
crashed the process on the H200 build (a g++ wrapper whose library folder held only libstdc++.a).
CMakeLists.txt links the shared runtime explicitly; this checks the built file.
"""

import shutil
import subprocess
import sys

import pytest

import mlx_fp4._ext as ext

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF linkage check (Linux)")


def _tool_output(tool, *args):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} (binutils) is not installed")
    return subprocess.run([tool, *args, ext.__file__], check=True, capture_output=True, text=True).stdout


def test_ext_needs_the_shared_libstdcxx():
    needed = [line for line in _tool_output("readelf", "-d").splitlines() if "(NEEDED)" in line]
    assert any("libstdc++.so" in line for line in needed), f"_ext does not load libstdc++.so: {needed}"


def test_ext_defines_no_private_cxx_abi():
    exported = _tool_output("nm", "-D", "--defined-only").split()
    private = sorted({s for s in exported if s in ("__cxa_throw", "__gxx_personality_v0", "__cxa_begin_catch")})
    assert not private, f"_ext carries its own C++ exception runtime: {private}"


def test_value_error_crosses_into_python():
    # The behaviour the two checks above protect (it crashed with a private runtime).
    import mlx.core as mx

    import mlx_fp4 as mx_fp4

    w, s = mx_fp4.quantize(mx.ones((16, 32)))
    with pytest.raises(ValueError, match="k"):
        mx_fp4.dequantize(w, s, k=0)
