"""Histogram bucket boundaries of the OTel score histogram (`gen_ai.evaluation.score`, unit 1).

The Prometheus score families have their own, one set per unit (score_families.py); the OTel
instrument is one histogram for every `gen_ai.evaluation.name`, so it keeps one wide layout.
"""

SCORE_BUCKETS: tuple[float, ...] = (
    0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0,
    2, 5, 10, 25, 50, 80, 90, 100, 1000, 10000, 100000,
)  # fmt: skip
"""Fine in [0, 1] (most metrics are ratios), around the 0-100 plan_adherence threshold, and coarse
above for the step-count, latency and token statistics."""
