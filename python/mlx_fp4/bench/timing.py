"""How one number is measured: warm-up, batched products per eval, median of repeats, time budget.

A *runner* is a callable ``run(count) -> seconds`` that builds ``count`` independent products
(each on the next weight copy) outside the clock, then times only their evaluation (``mx.eval``
+ ``mx.synchronize`` for MLX, the calls themselves for NumPy). Dividing by ``count`` removes the
per-eval launch overhead that dominates small problems on a GPU.
"""

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

OK = "ok"
SKIPPED_BUDGET = "skipped (budget)"


@dataclass
class TimingConfig:
    repeats: int = 5  # timed evals per point (fewer if the budget runs out; at least one)
    budget_s: float = 30.0  # wall-time cap per (point, implementation); inf disables skipping
    target_eval_s: float = 0.005  # grow products per eval until one eval lasts this long
    max_products: int = 32  # most independent products evaluated by one mx.eval
    warmup_s: float = 0.25  # keep warming up (batched evals) for this long when products are cheap

    def describe(self) -> str:
        return (
            f"per point: one untimed product (one-time costs, not charged to the budget), a second product, "
            f"then evals of P products for {self.warmup_s:g} s of warm-up while cheap, then the median of up to "
            f"{self.repeats} timed evals; each eval runs P independent products (P = ceil({self.target_eval_s * 1e3:g}"
            f" ms / time per product in warm-up), 1..{self.max_products}), each on the next rotated weight copy; "
            f"time per product = eval wall time / P; graph construction is outside the clock; the clock stops after "
            f"mx.eval + mx.synchronize; a point whose predicted time exceeds the {self.budget_s:g} s budget is "
            f"reported as '{SKIPPED_BUDGET}'; a product slower than half the budget is timed once (never the "
            f"first product: one over the budget is followed by a second, which decides)"
        )


@dataclass
class Measurement:
    status: str = OK
    seconds: Optional[float] = None  # median time per product
    seconds_min: Optional[float] = None
    repeats: int = 0
    products_per_eval: int = 0
    warmup_evals: int = 0
    predicted_s: Optional[float] = None  # extrapolated time per product used for the budget decision
    wall_s: float = 0.0  # wall time spent measuring this point
    first_call_s: Optional[float] = None  # the untimed first product (one-time costs included)

    def as_dict(self) -> dict:
        return asdict(self)


def _products(cfg: TimingConfig, per_product: float) -> int:
    return max(1, min(cfg.max_products, math.ceil(cfg.target_eval_s / max(per_product, 1e-9))))


# A single product this many times its prediction paid one-time costs (JIT, kernel load).
ONE_TIME_COST_FACTOR = 4.0


def seed_seconds(run: Callable[[int], float]) -> float:
    """Seconds of one product for seeding an Extrapolator: a second product, the first (one-time
    costs: a 26 ms first product at M = 1 predicted 3.3 s at M = 128 and skipped the point) untimed."""
    run(1)
    return run(1)


def measure(run: Callable[[int], float], cfg: TimingConfig, predicted_s: Optional[float] = None) -> Measurement:
    """Time one (point, implementation) with ``run(count) -> seconds for count products``.

    The first product pays one-time costs (JIT compilation, kernel loading, BLAS heuristics) and is
    not charged to the budget; P is planned from later products, never from that first one. Even a
    first product longer than the whole budget is never reported as the time (MLX's CUDA nvfp4
    path once took 31-47 s for its first product at a new M): a second product decides.
    """
    start = time.perf_counter()
    res = Measurement(predicted_s=predicted_s)
    budget = cfg.budget_s
    if predicted_s is not None and predicted_s > budget:
        res.status = SKIPPED_BUDGET
        return res
    if predicted_s is not None and 2.0 * predicted_s > budget:
        # Room for one product only: a single timed run, no warm-up, unless it lands far above
        # its prediction (a kernel built at this new M): then that was the first product, and a
        # second one is the sample.
        first = run(1)
        if first > ONE_TIME_COST_FACTOR * predicted_s:
            res.first_call_s = first
            return _single(res, run(1), start)
        return _single(res, first, start)

    first = run(1)
    res.first_call_s = first
    charged = time.perf_counter()
    res.warmup_evals = 1
    samples = []
    per_product = run(1)
    if first > budget and 2.0 * per_product > budget:
        # Slow every time, not only the first time: that second product is the one sample.
        return _single(res, per_product, start)
    products = 1
    if per_product >= max(cfg.warmup_s, cfg.target_eval_s):
        # A slow product: the first one was the warm-up, this one is already a timed sample.
        samples.append(per_product)
    else:
        # Batched warm-up evals for warmup_s (while cheap), so transients (thread wake-up, other
        # libraries' spinning threads) settle; P is re-planned from the last of them.
        res.warmup_evals = 2
        products = _products(cfg, per_product)
        while time.perf_counter() - charged < cfg.warmup_s and per_product * products < 0.1 * budget:
            per_product = run(products) / products
            res.warmup_evals += 1
        products = _products(cfg, per_product)
    left = budget - (time.perf_counter() - charged)
    repeats = max(1, min(cfg.repeats, int(left // max(per_product * products, 1e-12))))
    samples += [run(products) / products for _ in range(repeats - len(samples))]
    res.seconds = statistics.median(samples)
    res.seconds_min = min(samples)
    res.repeats = len(samples)
    res.products_per_eval = products
    res.wall_s = time.perf_counter() - start
    return res


def _single(res: Measurement, seconds: float, start: float) -> Measurement:
    res.seconds = res.seconds_min = seconds
    res.repeats = res.products_per_eval = 1
    res.wall_s = time.perf_counter() - start
    return res


class Extrapolator:
    """Predicts the time of an M from the last measured M of the same (shape, implementation).

    Time is assumed linear in M: exact for compute-bound runs, an overestimate for bandwidth-bound
    ones, so the budget errs towards skipping. Used only to decide what the budget allows.
    """

    def __init__(self):
        self._last = {}

    def record(self, key, m: int, seconds: Optional[float]) -> None:
        if seconds is not None and seconds > 0:
            self._last[key] = (m, seconds)

    def predict(self, key, m: int) -> Optional[float]:
        if key not in self._last:
            return None
        m0, t0 = self._last[key]
        return t0 * max(m, 1) / max(m0, 1)

    def known(self, key) -> bool:
        return key in self._last
