"""Concurrency and determinism of w4a16_matmul:

  * several Python threads evaluating at once (each with its own problems, and all on one shared
    problem) give results bit-identical to a serial evaluation;
  * several mx.new_stream(device) streams evaluated together (one mx.eval over all of them, and
    one stream per thread) give bit-identical results;
  * repeated runs are bit-identical, and so are runs in fresh processes with
    MLX_FP4_NUM_THREADS=1, 3 and the default (the reduction order does not depend on threads).

The C++ kernel's own thread pool runs under ThreadSanitizer in tests/cpp/run_sanitizers.sh.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlx_fp4 as mx_fp4
from common import package_pythonpath, rand_weights, rand_x, rng

ROOT = Path(__file__).resolve().parents[1]

# (M, N, K, x dtype, out dtype, epilogue kind): GEMV and GEMM paths, ragged shapes, epilogues.
PROBLEMS = [
    (1, 300, 600, mx.bfloat16, None, "none"),
    (5, 130, 257, mx.float16, mx.float32, "bias_silu"),
    (8, 64, 64, mx.float32, mx.bfloat16, "full"),
    (9, 97, 129, mx.bfloat16, None, "bias_silu"),
    (64, 200, 333, mx.float32, None, "full"),
    (300, 96, 128, mx.bfloat16, mx.float32, "bias_silu"),
]


def make(i):
    m, n, k, xd, od, epi = PROBLEMS[i]
    g = rng("concurrency", i)
    x = rand_x((m, k), xd, g)
    w, scales, _ = rand_weights(n, k, g)
    if epi == "bias_silu":
        e = [("add", rand_x((n,), mx.float32, g)), "silu"]
    elif epi == "full":
        e = [("mul", rand_x((m, n), mx.bfloat16, g)), ("add", rand_x((m, 1), mx.float32, g)), "gelu"]
    else:
        e = None
    kw = dict(global_scale=0.8125 if i % 2 else None, epilogue=e, out_dtype=od)
    mx.eval(x, w, scales)
    return x, w, scales, kw


def bits(a):
    """The exact bytes of an evaluated array (bf16 viewed as uint16)."""
    mx.eval(a)
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.array(a).tobytes()


@pytest.fixture(scope="module")
def problems():
    return [make(i) for i in range(len(PROBLEMS))]


def serial(problems, stream=None):
    return [bits(mx_fp4.w4a16_matmul(x, w, s, stream=stream, **kw)) for (x, w, s, kw) in problems]


def run_threads(fn, count):
    errors, results = [], [None] * count

    def body(t):
        try:
            results[t] = fn(t)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


def test_repeated_runs_are_bit_identical(device, problems):
    first = serial(problems)
    for _ in range(3):
        assert serial(problems) == first


def test_threads_each_own_problem(device, problems):
    """Each thread evaluates its own problem (all at once), several times."""
    expected = serial(problems)
    barrier = threading.Barrier(len(problems))

    def work(t):
        x, w, s, kw = problems[t]
        barrier.wait()
        return [bits(mx_fp4.w4a16_matmul(x, w, s, **kw)) for _ in range(5)]

    for t, outs in enumerate(run_threads(work, len(problems))):
        assert all(o == expected[t] for o in outs), f"problem {t} differs under threads"


def test_threads_share_inputs(device, problems):
    """Four threads build graphs on the same input arrays and evaluate concurrently."""
    expected = serial(problems)
    barrier = threading.Barrier(4)

    def work(t):
        barrier.wait()
        outs = [mx_fp4.w4a16_matmul(x, w, s, **kw) for (x, w, s, kw) in problems]
        return [bits(o) for o in outs]

    for outs in run_threads(work, 4):
        assert outs == expected


def test_streams_evaluated_together(device, problems):
    """Graphs placed on 4 new streams, evaluated with one mx.eval (the streams run concurrently)."""
    expected = serial(problems)
    streams = [mx.new_stream(device) for _ in range(4)]
    outs = [
        [mx_fp4.w4a16_matmul(x, w, s, stream=st, **kw) for (x, w, s, kw) in problems]
        for st in streams
    ]
    mx.eval(*[o for per in outs for o in per])
    for per in outs:
        assert [bits(o) for o in per] == expected


def test_one_stream_per_thread(device, problems):
    """Each thread makes its own stream (MLX streams belong to the thread that made them)."""
    expected = serial(problems)
    barrier = threading.Barrier(3)

    def work(t):
        st = mx.new_stream(device)
        barrier.wait()
        res = []
        for _ in range(3):
            outs = [mx_fp4.w4a16_matmul(x, w, s, stream=st, **kw) for (x, w, s, kw) in problems]
            mx.eval(*outs)
            res.append([bits(o) for o in outs])
        return res

    for per_thread in run_threads(work, 3):
        for outs in per_thread:
            assert outs == expected


_CHILD = r"""
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import mlx.core as mx
mx.set_default_device(mx.cpu)
import mlx_fp4 as mx_fp4
import test_concurrency as tc
out = {}
for i in range(len(tc.PROBLEMS)):
    x, w, s, kw = tc.make(i)
    out[i] = hashlib.sha256(tc.bits(mx_fp4.w4a16_matmul(x, w, s, **kw))).hexdigest()
out["threads"] = mx_fp4.cpu_info()["threads"]
print(json.dumps(out))
"""


def child_hashes(threads):
    env = dict(os.environ)
    env.pop("MLX_FP4_NUM_THREADS", None)
    if threads is not None:
        env["MLX_FP4_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = package_pythonpath(ROOT / "tests")
    r = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT / "tests")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_cpu_results_independent_of_thread_count(problems):
    """Fresh processes with MLX_FP4_NUM_THREADS=1, 3 and unset give the same bits as this one."""
    with mx.stream(mx.cpu):
        here = {str(i): hashlib.sha256(b).hexdigest() for i, b in enumerate(serial(problems))}
    runs = {t: child_hashes(t) for t in (1, 3, None)}
    assert runs[1]["threads"] == 1 and runs[3]["threads"] == 3
    for t, h in runs.items():
        h = dict(h)
        h.pop("threads")
        assert h == here, f"MLX_FP4_NUM_THREADS={t} differs from this process"
