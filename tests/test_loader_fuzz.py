"""Loader fuzz (issue 38): CASES seeded random corruptions of small valid ModelOpt (two shards +
index, its config in hf_quant_config.json or config.json), compressed-tensors and MLX folders:
truncations, byte flips, header JSON edits (dtype, shape, data_offsets, names, metadata),
per-tensor scales set to NaN / inf / 0 / -1 / 1e-45 / 3e38, config and index edits (fields,
types, paths outside the folder), deleted or emptied files. Each case loads with load_nvfp4 and
either raises "[load_nvfp4] ..." (a ValueError naming the file, field or tensor) or loads exactly
what the files hold (checked without MLX); no other exception, no file opened outside the folder,
no case over its time limit. The cases run in a subprocess (loader_fuzz_worker.py): a crash
there fails this test with the case it was running. Rerun one case with
``python loader_fuzz_worker.py DIR SEED 1 progress.txt`` from tests/.

Found and fixed with it: a string / number where config.json has an object (``quantization``,
``config_groups``, ``text_config``) gave AttributeError; quant_method 'mlx' a KeyError; a
compressed-tensors divisor of 1e-38 (or a ModelOpt multiplier of 1e36) an inf global scale and
an MLX one of 1e-45 a zero multiplier; a layer holding tensors of two dialects, or a tensor named
like the converted ones, loaded whichever came last; a compressed-tensors layer without its
packed weight passed its scales through as plain tensors; and mx.load accepted headers whose byte
count overflows (a [65536]*4 uint8 tensor in 0 bytes, dims of 2^31 or negative)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from common import package_pythonpath

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "loader_fuzz_worker.py"
CASES = 2000
FIRST_SEED = 0
TIMEOUT_S = 300  # ~10 s on a 2-core CI box; generous for a loaded one, still a hang's bound
MIN_SHARE = 0.2  # both outcomes must be common, or the corruptions no longer reach the loader


def test_loader_fuzz(tmp_path):
    progress = tmp_path / "progress.txt"
    env = dict(os.environ, PYTHONPATH=package_pythonpath(TESTS))
    cmd = [sys.executable, str(WORKER), str(tmp_path), str(FIRST_SEED), str(CASES), str(progress)]

    def last_case():
        lines = progress.read_text().splitlines() if progress.is_file() else []
        return lines[-1] if lines else "(before the first case)"

    try:
        proc = subprocess.run(cmd, cwd=TESTS, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the fuzz ran past {TIMEOUT_S} s; last case: {last_case()}") from None
    assert proc.returncode == 0, (
        f"the fuzz worker died (exit {proc.returncode}) in case: {last_case()}\n{proc.stderr[-3000:]}"
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    failures = [d for d in lines if "failure" in d]
    summary = [d for d in lines if "summary" in d]
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n".join(
        f"  {d['case']}\n    -> {d['outcome']}: {d['failure']}" for d in failures[:10]
    )
    assert len(summary) == 1 and summary[0]["cases"] == CASES, proc.stdout[-2000:]
    counts = summary[0]["summary"]
    assert sum(counts.values()) == CASES and set(counts) <= {"error", "loaded"}, counts
    assert min(counts.get("error", 0), counts.get("loaded", 0)) >= MIN_SHARE * CASES, counts
