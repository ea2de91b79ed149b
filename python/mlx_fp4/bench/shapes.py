"""Problem sizes: real layer shapes (N x K) and the M sweep, with per-device defaults."""

from dataclasses import dataclass

# Llama-3-8B projections (q/o: 4096x4096, gate/up: 14336x4096, down: 4096x14336) and a square 8192.
LAYER_SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192))
M_SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

# Largest default M per device. MLX's CPU baselines are scalar (26 s at M=256 for 4096^2),
# so the CPU sweep stops at 256 unless --m asks for more.
DEFAULT_M_CAP = {"cpu": 256, "gpu": 8192}

QUICK_SHAPES = ((4096, 4096),)
QUICK_M = (1, 64)

# NVFP4: two E2M1 codes per byte, one E4M3 scale byte per 16 weights along K (MXFP4: one E8M0
# byte per 32, --mode mxfp4).
GROUP_SIZE = 16
MODE_GROUP = {"nvfp4": 16, "mxfp4": 32}


@dataclass(frozen=True)
class Shape:
    n: int
    k: int
    group: int = GROUP_SIZE  # weights per scale byte (the mode's group size)

    @property
    def name(self) -> str:
        return f"{self.n}x{self.k}"

    @property
    def packed_bytes(self) -> int:
        return self.n * ((self.k + 1) // 2)

    @property
    def scale_bytes(self) -> int:
        return self.n * ((self.k + self.group - 1) // self.group)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the quantized weight as stored: packed codes + scales."""
        return self.packed_bytes + self.scale_bytes

    def flops(self, m: int) -> int:
        return 2 * m * self.n * self.k

    def traffic_bytes(self, m: int, act_bytes: int = 2) -> int:
        """Weight + activation x + output bytes (minimum traffic of one product)."""
        return self.weight_bytes + m * self.k * act_bytes + m * self.n * act_bytes


def parse_shape(text: str, group: int = GROUP_SIZE) -> Shape:
    """Parse 'NxK' (e.g. '14336x4096'); K must be a multiple of the group (16, mxfp4 32)."""
    parts = text.lower().replace("*", "x").split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"[bench] --shapes expected NxK such as 4096x4096 but got {text!r}")
    n, k = (int(p) for p in parts)
    if n <= 0 or k <= 0 or k % group:
        raise ValueError(
            f"[bench] --shapes expected N > 0 and K a positive multiple of {group} but got {text!r}"
        )
    return Shape(n, k, group)


def default_shapes(quick: bool, group: int = GROUP_SIZE) -> list:
    return [Shape(n, k, group) for n, k in (QUICK_SHAPES if quick else LAYER_SHAPES)]


def default_m(device: str, quick: bool) -> list:
    if quick:
        return list(QUICK_M)
    return [m for m in M_SWEEP if m <= DEFAULT_M_CAP[device]]
