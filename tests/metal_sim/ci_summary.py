"""Writes what the macOS CI job verified (Markdown, for $GITHUB_STEP_SUMMARY), from the GPU MLX
reports and the JUnit XML of the test run: whether the Metal kernels ran on this GPU or only the
CPU fallback did (hosted runners are VMs with a paravirtual GPU).

Usage: python tests/metal_sim/ci_summary.py junit.xml
"""

import sys
import xml.etree.ElementTree as ET

import mlx.core as mx


def counts(junit, module):
    passed = skipped = failed = 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        if module not in case.get("classname", ""):
            continue
        if case.find("skipped") is not None:
            skipped += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        else:
            passed += 1
    return passed, skipped, failed


def main(argv):
    if not mx.metal.is_available():
        print("### macOS job: MLX reports no Metal device: nothing ran on a GPU.")
        return 0
    info = mx.device_info(mx.gpu)
    arch = str(info.get("architecture", "?"))
    p, s, f = counts(argv[1], "test_metal_gpu")
    print(f"### macOS job on {info.get('device_name', '?')} (architecture `{arch}`)\n")
    if arch.startswith("applegpu_g") and p > 10:
        print(f"Metal kernels ran on this GPU: {p} GPU tests passed, {f} failed, {s} skipped "
              "(every forced kernel configuration, the automatic choice, the MLX route, against "
              "the float64 reference).")
    else:
        print(f"Not an Apple7-or-later GPU: the Metal kernels did **not** run here. Verified: the "
              f"op falls back to the CPU kernels on this GPU ({p} GPU-side tests passed, {f} "
              f"failed, {s} skipped) and the CPU suite. The kernels themselves are checked on "
              "Linux by the Metal simulator (tests/metal_sim).")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
