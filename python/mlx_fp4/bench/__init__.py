"""Benchmark harness for mlx_fp4.w4a16_matmul: ``python -m mlx_fp4.bench --help``.

One job per module: ``shapes`` (problem sizes and per-device defaults), ``timing`` (how one
number is measured), ``baselines`` (our op, the MLX and NumPy baselines, the rooflines),
``report`` (system facts, JSON and the printed table), ``plot`` (the PNG), ``__main__`` (CLI).
"""
