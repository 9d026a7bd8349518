"""Histogram bucket boundaries shared by the Prometheus and OTel score histograms, so the two views
of one score cannot drift apart."""

SCORE_BUCKETS: tuple[float, ...] = (
    0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0,
    2, 5, 10, 25, 50, 80, 90, 100, 1000, 10000, 100000,
)  # fmt: skip
"""Fine in [0, 1] (most metrics are ratios), around the 0-100 plan_adherence threshold, and coarse
above for the step-count, latency and token statistics."""
