"""Fail fast, with one actionable message, when the running MLX is not the one we were built against."""

# The MLX release this package pins (pyproject.toml; the build records the one it compiled against).
PINNED_MLX = "0.32.4"


def mlx_import_hint(error: ImportError) -> str:
    """What to install when ``import mlx.core`` fails: on Linux ``pip install mlx`` (or ``pip install .``
    of this package without an extra) gives MLX without a backend, and libmlx.so is missing."""
    return (
        f"mlx_fp4 needs MLX, whose core failed to load ({error}). On Linux the mlx wheel alone has no "
        f'backend: pip install "mlx[cpu]=={PINNED_MLX}" (CPU) or "mlx[cuda13]=={PINNED_MLX}" (NVIDIA GPU); from '
        'a clone of mlx-fp4: pip install ".[cpu]". On macOS: pip install "mlx==' + PINNED_MLX + '".'
    )


def check_mlx_version() -> None:
    import mlx.core as mx

    try:
        from ._build_info import MLX_VERSION as built
    except ImportError as e:  # the compiled extension is missing entirely
        raise ImportError(
            "mlx_fp4's compiled extension is missing. Reinstall it: pip install --force-reinstall "
            "--no-deps . (add [cpu] on Linux), or run tools/dev-build.sh for a development tree."
        ) from e
    running = mx.__version__
    if running.split(".dev")[0] != built:
        raise ImportError(
            f"mlx_fp4 was built against mlx=={built} but mlx=={running} is installed; MLX's C++ ABI "
            f"changes between releases. Reinstall one of them: pip install 'mlx=={built}' "
            f"(Linux: 'mlx[cpu]=={built}'), or rebuild mlx_fp4 against the installed MLX."
        )
    try:
        from . import _ext
    except ImportError as e:
        raise ImportError(
            f"mlx_fp4's extension failed to load against mlx=={running} ({e}). Reinstall mlx_fp4 against "
            "this MLX (pip install --force-reinstall --no-deps --no-build-isolation .)."
        ) from e
    # One round trip proves nanobind sees MLX's array type (a nanobind ABI mismatch fails here).
    try:
        _ext.dequantize(mx.zeros((1, 1), dtype=mx.uint8), mx.zeros((1, 1), dtype=mx.uint8), k=1)
    except TypeError as e:
        raise ImportError(
            "mlx_fp4's extension cannot exchange arrays with this MLX (nanobind ABI mismatch: MLX 0.32.4 "
            f"needs nanobind 3.x at build time). Rebuild mlx_fp4. Detail: {e}"
        ) from e
