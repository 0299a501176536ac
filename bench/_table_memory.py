"""Memory per live feature of the CTR accessor's split rows (``sparseps bench table``).

The stream: Zipf(1.1) ranks drawn until ``n_distinct`` distinct ids were seen (ids =
splitmix64 of the rank, so hot ids are scattered), each occurrence clicked with
probability 3%. Most ids of it are seen once or twice (the bench reports how many), as in
a click log. Every occurrence is pushed (show 1, click 0/1) in batches of 65,536 through
``SparseTable.push``, the growth path, into three tables in turn:

- **today's full-row layout** (the baseline): ``TableConfig(dim=D)`` with today's default
  rule (Adagrad: one accumulator per element), every row whole from its first push;
- **the accessor** (``Accessor(embed_dim=1, embedx_threshold=T)``, ``SparseAdagrad`` for
  both parts, embedx dim D): an embed part per row, the embedx part only for rows whose
  show/click score reached T; T is the first of a list of round values that gives
  10-20% of the ids an embedx part (chosen from the stream's final scores);
- the same with ``embedx_dtype="float16"``.

Bytes are the table's own (``SparseTable.nbytes``: row storage, embedx parts, key index,
free lists, growth slack included) over its live rows. Paddle's figure is computed from
``CtrCommonAccessor``'s field list with ``SparseAdaGradSGDRule`` for both parts (8-byte
key + slot, unseen_days, delta_score, show, click, embed_w, embed_g2sum, embedx_g2sum and
D embedx weights as float32), which Paddle's memory table holds for every feature, hash
overhead not counted.
"""

from __future__ import annotations

import gc
import time

import numpy as np

from sparseps import optim
from sparseps.benchmarking import BenchRecord
from sparseps.config import Accessor, TableConfig
from sparseps.core.hashing import mix64_array
from sparseps.table import KeyIndex, SparseTable

ZIPF_A = 1.1
CTR = 0.03
PUSH = 1 << 16
THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0, 5.0)
PADDLE_FIELDS = ("slot", "unseen_days", "delta_score", "show", "click", "embed_w",
                 "embed_g2sum", "embedx_g2sum")  # fmt: skip


def paddle_bytes(dim: int) -> int:
    """Bytes of one feature in Paddle's CtrCommonAccessor layout (SparseAdaGrad rules)."""
    return 8 + 4 * (len(PADDLE_FIELDS) + dim)


def zipf_stream(n_distinct: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(ids uint64, clicks float32)``: occurrences until ``n_distinct`` ids were seen."""
    rng = np.random.default_rng(seed)
    seen = KeyIndex()
    parts = []
    while len(seen) < n_distinct:
        ranks = mix64_array(rng.zipf(ZIPF_A, 1 << 22).astype(np.uint64))
        _, new = seen.find_or_insert(ranks)
        room = n_distinct - (len(seen) - int(new.sum()))
        if len(seen) > n_distinct:  # stop at the occurrence that brought the last new id
            ranks = ranks[: int(np.searchsorted(np.cumsum(new), room, side="left")) + 1]
        parts.append(ranks)
    ids = np.concatenate(parts)
    clicks = (rng.random(ids.size) < CTR).astype(np.float32)
    return ids, clicks


def _threshold(ids: np.ndarray, clicks: np.ndarray) -> tuple[float, float, dict]:
    """The first threshold of THRESHOLDS giving 10-20% of ids an embedx part (scores
    only grow without decay, so a row's final score decides), its share, and how often
    ids are seen."""
    uniq, inverse, shows = np.unique(ids, return_inverse=True, return_counts=True)
    click_sum = np.bincount(inverse, weights=clicks, minlength=uniq.size)
    score = (shows - click_sum) * 0.1 + click_sum * 1.0
    seen = {"seen_once": float(np.mean(shows == 1)), "seen_twice": float(np.mean(shows == 2))}
    best = None
    for t in THRESHOLDS:
        share = float(np.mean(score >= t))
        if 0.10 <= share <= 0.20:
            return t, share, seen
        if best is None or abs(share - 0.15) < abs(best[1] - 0.15):
            best = (t, share)
    assert best is not None
    return best[0], best[1], seen


def _fill(
    config: TableConfig, ids: np.ndarray, clicks: np.ndarray
) -> tuple[float, int, int, float]:
    """``(bytes per live row, live rows, rows with an embedx part, seconds)``."""
    table = SparseTable(config)
    grads = np.random.default_rng(1).normal(0, 0.01, (PUSH, config.dim)).astype(np.float32)
    start = time.perf_counter()
    for at in range(0, ids.size, PUSH):
        part = ids[at : at + PUSH]
        table.push(part, grads[: part.size], clicks=clicks[at : at + PUSH])
    seconds = time.perf_counter() - start
    stats = table.stats()
    result = (table.nbytes / len(table), len(table), stats.embedx_rows, seconds)
    del table
    gc.collect()
    return result


def run(quick: bool, dims=(8, 64)) -> list[BenchRecord]:
    n_distinct = 1_000_000 if quick else 10_000_000
    ids, clicks = zipf_stream(n_distinct)
    threshold, share, seen = _threshold(ids, clicks)
    records = []
    for dim in dims:
        today = TableConfig(name=f"today{dim}", dim=dim, rule=optim.Adagrad())
        today_bytes, rows, _, today_s = _fill(today, ids, clicks)
        paddle = float(paddle_bytes(dim))
        for dtype in ("float32", "float16"):
            accessor = Accessor(embed_dim=1, embedx_threshold=threshold, embedx_dtype=dtype)
            config = TableConfig(name=f"ctr{dim}", dim=1 + dim, rule=optim.SparseAdagrad(),
                                 accessor=accessor)  # fmt: skip
            ours, live, embedx_rows, ours_s = _fill(config, ids, clicks)
            assert live == rows == n_distinct, (live, rows, n_distinct)
            params = {
                "embedx_dim": dim, "embedx_dtype": dtype, "features": live,
                "stream": int(ids.size), "zipf_a": ZIPF_A, "ctr": CTR,
                "seen_once": round(seen["seen_once"], 3),
                "seen_twice": round(seen["seen_twice"], 3),
                "embedx_threshold": threshold, "embedx_share": round(embedx_rows / live, 3),
                "expected_share": round(share, 3),
                "today_rule": "adagrad", "rule": "sparse_adagrad",
                "push_s": round(ours_s, 1), "today_push_s": round(today_s, 1),
            }  # fmt: skip
            records.append(BenchRecord("bytes_per_feature", ours, "bytes", today_bytes, params))
            records.append(BenchRecord(
                "bytes_per_feature_vs_paddle", ours, "bytes", paddle,
                {**params, "paddle_fields": f"key + {' + '.join(PADDLE_FIELDS)} + "
                 f"{dim} embedx_w (float32)"},
            ))  # fmt: skip
    return records
