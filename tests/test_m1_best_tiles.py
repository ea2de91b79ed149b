"""scripts/m1_best_tiles.py (a GPU session's helper) on the line format kernel_harness prints for
`bench --decode` (csrc/cuda/kernel_harness_bench.h), checked without a GPU."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "m1_best_tiles.py")


def test_harness_prints_the_parsed_format():
    with open(os.path.join(ROOT, "csrc", "cuda", "kernel_harness_bench.h")) as f:
        src = f.read()
    assert re.search(r'"decode,%lldx%lld,%s,%d/%d/%d,us=%\.2f,', src), "kernel_harness bench --decode line format"


def test_fastest_tile_per_shape(tmp_path):
    log = tmp_path / "kbench.txt"
    log.write_text("bench,launch_floor,us=2.10\n"
                   "decode,1024x4096,plan,1/1/8,us=6.10,wGBps=400\n"
                   "decode,1024x4096,tile,1/1/8,us=6.00,wGBps=410\n"
                   "decode,1024x4096,tile,1/1/16,us=5.00,wGBps=490\n"
                   "decode,14336x4096,plan,1/1/2,us=20.0,wGBps=1600\n"
                   "decode,14336x4096,tile,1/2/4,us=18.5,wGBps=1700\n"
                   "decode,14336x4096,tile,1/1/2,us=19.9,wGBps=1600\n")
    out = subprocess.run([sys.executable, SCRIPT, str(log)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1,1,16@1024x4096;1,2,4@14336x4096"
    assert "1.22x the plan's 1,1,8" in out.stderr


def test_no_decode_lines_is_an_error(tmp_path):
    log = tmp_path / "empty.txt"
    log.write_text("bench,launch_floor,us=2.10\n")
    out = subprocess.run([sys.executable, SCRIPT, str(log)], capture_output=True, text=True)
    assert out.returncode == 1 and "no 'decode,...' lines" in out.stderr
