"""Interleaved decode timing (``python -m mlx_fp4.bench decode --interleave``): every variant of one
point in one process, their timed generations in turn, so that the host's drift over a run (MLX's
cost per graph node moved 1.8x between the consecutive processes of one H100 run) falls on every
variant alike, and each round gives a paired ratio.

Round r times every variant once, starting at variant r mod n (rotating, so no variant always runs
first). Each variant is built and warmed up as in its own process (``decode.prepare_variant``) and
reported the same way (``decode.finish_variant``); the parent spawns this module as its worker.
"""

import json
import sys

import mlx.core as mx

from .decode import (VARIANT_SEPARATOR, _device, finish_variant, parse_args, prepare_variant, process_states,
                     timed_run)


def run_interleaved(args) -> list:
    variants, layers = args.worker.split(",")
    on_gpu = _device(args) == "gpu"
    mx.set_default_device(mx.gpu if on_gpu else mx.cpu)
    states = [prepare_variant(args, v, int(layers)) for v in variants.split(VARIANT_SEPARATOR)]
    before = process_states(on_gpu)
    for r in range(args.repeats):
        k = r % len(states)
        for state in states[k:] + states[:k]:
            timed_run(state, args.tokens, r)
    after = process_states(on_gpu)
    return [dict(finish_variant(args, s, before, after), interleaved=True) for s in states]


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.worker or "," not in args.worker:
        raise SystemExit(f"[bench decode] --worker expected 'variant{VARIANT_SEPARATOR}variant...,layers' "
                         f"but got {args.worker!r}")
    for result in run_interleaved(args):
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
