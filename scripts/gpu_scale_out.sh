#!/usr/bin/env bash
# Tensor parallelism on 2 NVIDIA GPUs (NCCL): what issues 8 (part 4) and 20 run on an nvidia-h200-x2 machine.
#
#   bash scripts/gpu_scale_out.sh [STEP ...]     (default steps: build equiv bench report)
#
# Steps:
#   build   scripts/gpu_check.sh build (the extension against MLX's CUDA build, into python/mlx_fp4/)
#   equiv   tests/distributed_worker.py on 2 GPUs through `mlx.launch -n 2 --backend nccl`: the
#           same checks CI runs on 2 CPU ranks over ring (sharded FP4 layers vs the float64
#           reference within the tolerance table, kernel is ours, block-boundary errors on every
#           rank, tiny mlx-lm Llama sharded vs unsharded logits, shard-then-convert bit-identical)
#   bench   scripts/scale_out_bench.py: FP4 SwiGLU MLP stack, hidden 8192, intermediate 28672,
#           LAYERS blocks (default 8, 3.2 GiB of FP4 weights), bf16 activations, tokens 1..2048: 1 GPU (FP4Linear) vs
#           2 GPUs (FP4AllToSharded/FP4ShardedToAll, fp32 and bf16 all_sum)
#   report  $OUT/scale_out.md: the table for the README (speedup of 2 GPUs over 1)
#   why512  what the 512-token slowdown is made of (issue 20): the same stack with all_sum as the
#           identity (compute only) at TOKENS, all_sum alone of [M, 8192] fp32/bf16 for M in
#           1..2048, the 2-GPU stack at 512 with each CUDA path forced (MLX_FP4_CUDA_PATH=tc|dequant),
#           and NCCL's transport choice (NCCL_DEBUG=INFO: P2P/NVLink or SHM through the host)
#   sharded python -m mlx_fp4.bench sharded on 1 and 2 GPUs: llama3-8b (whole model), llama3-405b
#           and deepseek-v3 (--layers auto: what fits one GPU's share), mlx_fp4 vs MLX nvfp4
#           sharded the same way, communication separated; $OUT/sharded/*.md scaling tables
#
# Environment: PY (python with mlx[cuda13]==0.32.4, nanobind 3.x and mlx-lm==0.32.2; default
# python3), OUT (default ./gpu-scale-out-out), LAYERS, TOKENS, ITERS. NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0 is exported and passed to every rank). Exit code 1 when a step failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-python3}"
OUT="${OUT:-$ROOT/gpu-scale-out-out}"
LAYERS="${LAYERS:-8}"
TOKENS="${TOKENS:-1,8,32,128,512,2048}"
ITERS="${ITERS:-20}"
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(build equiv bench report why512 sharded)
FAILED=()
PP="$ROOT/python:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}"
# The launcher as a module: works where pip installed MLX with --target (no bin/mlx.launch).
LAUNCH=("$PY" -c 'import sys; from mlx._distributed_utils.launch import main; sys.exit(main())')
NCCL_ARGS=(-n 2 --backend nccl --python "$PY" --env NCCL_NVLS_ENABLE=0 --env "PYTHONPATH=$PP")

step_build() { OUT="$OUT/gpu-check" bash scripts/gpu_check.sh build; }

step_equiv() {
  local d="$OUT/equiv"
  rm -rf "$d" && mkdir -p "$d"
  timeout 600 "${LAUNCH[@]}" "${NCCL_ARGS[@]}" --env MLX_FP4_DIST_BACKEND=nccl \
    --env MLX_FP4_DIST_DEVICE=gpu tests/distributed_worker.py "$d"
  PYTHONPATH="$PP" "$PY" - "$d" <<'PYEOF'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1]); ok = True
for r in (0, 1):
    f = d / f"rank{r}.json"
    if not f.exists():
        print(f"rank {r}: no result file"); ok = False; continue
    s = json.loads(f.read_text())
    if not s.get("initialized"):
        print(f"rank {r}: init failed: {s.get('init_error')}"); ok = False; continue
    for name, v in s["checks"].items():
        print(f"rank {r} {name:22s} {'ok  ' if v['ok'] else 'FAIL'} {v['seconds']:7.2f}s  {str(v['detail'])[:400]}")
        ok &= v["ok"]
    ok &= bool(s.get("done"))
sys.exit(0 if ok else 1)
PYEOF
}

step_bench() {
  local common=(scripts/scale_out_bench.py --layers "$LAYERS" --tokens "$TOKENS" --iters "$ITERS")
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$PP" "$PY" "${common[@]}" --json "$OUT/bench_1gpu.json" || return 1
  timeout 900 "${LAUNCH[@]}" "${NCCL_ARGS[@]}" "${common[@]}" --reduce float32 --json "$OUT/bench_2gpu_fp32.json" || return 1
  timeout 900 "${LAUNCH[@]}" "${NCCL_ARGS[@]}" "${common[@]}" --reduce output --json "$OUT/bench_2gpu_bf16.json" || return 1
  for f in bench_1gpu bench_2gpu_fp32 bench_2gpu_bf16; do [ -s "$OUT/$f.json" ] || { echo "missing $f.json"; return 1; }; done
}

step_why512() {
  local d="$OUT/why512" common=(scripts/scale_out_bench.py --layers "$LAYERS" --iters "$ITERS")
  mkdir -p "$d"
  timeout 900 "${LAUNCH[@]}" "${NCCL_ARGS[@]}" "${common[@]}" --tokens "$TOKENS" --no-comm --json "$d/2gpu_no_comm.json" || return 1
  timeout 600 "${LAUNCH[@]}" "${NCCL_ARGS[@]}" --env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=INIT,GRAPH,P2P \
    "${common[@]}" --allsum-sweep 1,8,32,128,512,2048 --json "$d/allsum.json" > "$d/allsum_nccl_info.log" 2>&1 || return 1
  grep -E "via P2P|via SHM|NVLS|Channel 00|Connected all rings" "$d/allsum_nccl_info.log" | head -20
  grep -E "^all_sum" "$d/allsum_nccl_info.log"
  for path in tc dequant; do
    timeout 600 "${LAUNCH[@]}" "${NCCL_ARGS[@]}" --env MLX_FP4_CUDA_PATH=$path "${common[@]}" --tokens 512 \
      --json "$d/2gpu_512_$path.json" || return 1
    CUDA_VISIBLE_DEVICES=0 MLX_FP4_CUDA_PATH=$path PYTHONPATH="$PP" "$PY" "${common[@]}" --tokens 512 \
      --json "$d/1gpu_512_$path.json" || return 1
  done
}

step_sharded() {
  local d="$OUT/sharded" b=(-m mlx_fp4.bench sharded --out "$OUT/sharded")
  mkdir -p "$d"
  for preset in llama3-8b llama3-405b deepseek-v3; do
    CUDA_VISIBLE_DEVICES=0 PYTHONPATH="$PP" "$PY" "${b[@]}" --preset "$preset" || return 1
    # capacity presets: the 2-GPU run holds as many layers per GPU as the 1-GPU run, so the
    # per-layer scaling compares like with like (--compare divides by the layer count)
    local layers; layers=$("$PY" -c "import json;print(json.load(open('$d/sharded_${preset}_1rank.json'))['layers'])")
    timeout 1200 "${LAUNCH[@]}" "${NCCL_ARGS[@]}" "${b[@]}" --preset "$preset" --layers "$layers" --backend nccl || return 1
    PYTHONPATH="$PP" "$PY" "${b[@]}" --compare "$d/sharded_${preset}_1rank.json" "$d/sharded_${preset}_2rank.json" \
      | tee "$d/sharded_${preset}.md"
  done
}

step_report() {
  "$PY" - "$OUT" <<'PYEOF'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
one = json.loads((d / "bench_1gpu.json").read_text())
two = {k: json.loads((d / f"bench_2gpu_{k}.json").read_text()) for k in ("fp32", "bf16")}
lines = [
    f"FP4 SwiGLU MLP stack: hidden {one['hidden']}, intermediate {one['intermediate']}, "
    f"{one['layers']} blocks, {one['dtype']} activations, random NVFP4 weights "
    f"({one['weight_bytes_per_rank'] / 2**30:.2f} GiB on 1 GPU); MLX {one['mlx']}, NCCL.",
    "",
    "| tokens | 1 GPU ms | 2 GPUs ms (fp32 all_sum) | speedup | 2 GPUs ms (bf16 all_sum) | speedup |",
    "| ---: | ---: | ---: | ---: | ---: | ---: |",
]
for r1, rf, rb in zip(one["rows"], two["fp32"]["rows"], two["bf16"]["rows"]):
    a, b, c = r1["ms_per_forward"], rf["ms_per_forward"], rb["ms_per_forward"]
    lines.append(f"| {r1['tokens']} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {c:.3f} | {a / c:.2f}x |")
text = "\n".join(lines) + "\n"
(d / "scale_out.md").write_text(text)
print(text)
PYEOF
}

for s in "${STEPS[@]}"; do
  echo "=== $s" | tee "$OUT/$s.log"
  start=$(date +%s)
  if ! "step_$s" >>"$OUT/$s.log" 2>&1; then FAILED+=("$s"); fi
  echo "=== $s: $(( $(date +%s) - start )) s, $([[ " ${FAILED[*]-} " == *" $s "* ]] && echo FAILED || echo ok)" | tee -a "$OUT/$s.log"
  tail -n 30 "$OUT/$s.log"
done
[ ${#FAILED[@]} -eq 0 ] || { echo "failed steps: ${FAILED[*]}"; exit 1; }
