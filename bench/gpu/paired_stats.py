"""Round-by-round comparison of two impls timed in the same interleaved rounds (interleaved_timer):
the ratio of their times per round, its median and a distribution-free 95% confidence interval of
that median. Pairing by round cancels drift that both see (clocks, L2 and DRAM state between
rounds), so a tie shows as an interval around 1.0. No torch: the report and the tests import it."""
import math
import statistics


def paired_ratio(fast, slow):
    """Round-by-round ratio slow[r] / fast[r] of two impls timed in the same rounds (> 1: `fast` is
    faster): (median, lower, upper, n), the bounds a distribution-free 95% confidence interval of
    the median (the order statistics of ranks n/2 - 0.98 sqrt(n) and n/2 + 1 + 0.98 sqrt(n)); None
    unless both have the same rounds."""
    if not fast or len(fast) != len(slow) or len(fast) < 10:
        return None
    r = sorted(b / a for a, b in zip(fast, slow) if a > 0)
    n = len(r)
    half = 0.98 * n ** 0.5
    lo, hi = max(0, math.floor(n / 2 - half) - 1), min(n - 1, math.ceil(n / 2 + half))  # 0-based
    return statistics.median(r), r[lo], r[hi], n
