"""Synthetic Criteo-format data from a planted logistic model.

The *planted model* depends only on ``seed`` (and, for drifting data, on ``day``):

- 26 categorical slots with Criteo's published per-slot cardinalities (3 to 10 million
  values); value ``k`` of a slot is drawn with a bounded power law (Zipf-like,
  ``P(k) ~ (k + 1) ** -a``, ``a`` per slot in 1.05..1.5) and is missing with a per-slot
  rate (0 to 45%); it is written as 8 hex digits, a bijection of ``k``, like real Criteo.
- each value has a weight ``w = scale_slot * Laplace * (1 + k / 100) ** -0.75`` (heavier
  tails than a normal; rarer values carry less signal, as in real logs), the Laplace draw
  computed from a hash of ``(seed, slot, k)``, so no table of millions of weights is
  stored; four slot pairs add an interaction weight per pair of values.
- 13 integer dense features ``floor(exp(mu + sigma * z)) - 1`` (counts, some -1, some
  missing); each adds ``beta * (log(1 + max(x, 0)) - centre)``, so they correlate with
  the label through exactly the transform the readers apply.
- ``p = sigmoid(bias + sum of the above)``; ``bias`` is solved so the CTR is about 22%.
  The label is Bernoulli(p). Everything ``p`` depends on is in the written row, so ``p``
  is the Bayes-optimal prediction and its AUC the best any model can reach.

Knobs (:class:`DataKnobs`; the defaults give exactly the rows above): the click rate the
bias is solved for, the spread of the planted logit (signal strength), the mean Zipf
exponent of the id frequencies, how fast a value's weight decays with its frequency rank
(``rare_power``: 0 puts as much signal in rare ids as in frequent ones), label noise (a
share of labels drawn at the base click rate whatever the features:
``p = (1 - noise) * sigmoid(...) + noise * click_rate``, still the Bayes-optimal
prediction and with the same mean) and a factor on every missing rate.

Drift: with ``drift > 0`` the weights of day ``d`` are ``cos(t) w_a + sin(t) w_b`` with
``t = drift * d`` and two independent weight fields, so the model changes smoothly from
day to day while each day looks alike.

Rows depend on ``(seed, split, part, chunk)`` through their own random stream, so files
can be generated independently and identically on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..core.atomic_file import replaced_atomically
from ..core.hashing import GOLDEN, mix64_array
from ..errors import ConfigError

__all__ = [
    "CARDINALITIES",
    "DataKnobs",
    "Generated",
    "PlantedModel",
    "generate",
    "planted_model",
    "probability",
    "rare_signal_share",
    "to_table",
    "write_dataset",
]

# Criteo display ads (Kaggle) distinct values per categorical column C1..C26.
CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
CROSSES = ((0, 1), (4, 5), (8, 13), (16, 19))  # slot pairs with interaction weights
NUM_DENSE = 13
TARGET_CTR = 0.22
LOGIT_SD = 1.6  # spread of the planted logit: Bayes AUC about 0.83 at a 22% CTR
# Rare values carry less signal, as in real logs (a value's weight is damped by
# (1 + k / RARE_SCALE) ** -RARE_POWER for its frequency rank k): most of the planted signal
# sits in values a model sees often enough to learn in one pass over ~1M rows.
RARE_SCALE = 100.0
RARE_POWER = 0.75
ZIPF_MEAN = 1.275  # mean of the per-slot exponents, drawn uniform in [1.05, 1.5]
RARE_RANK = 1000  # values past this frequency rank of their slot count as rare ids
_SPLITS = {"train": 1, "test": 2, "calibration": 3}


def _mix64(x: np.ndarray) -> np.ndarray:
    """One splitmix64 step of every value: the Weyl increment (wraps on purpose), then the
    finaliser of :mod:`sparseps.core.hashing` (the project's one copy of it)."""
    return mix64_array(x + GOLDEN)


def _key(*parts: int) -> np.uint64:
    key = np.zeros(1, np.uint64)
    for part in parts:
        key = _mix64(key ^ np.uint64(part & 0xFFFFFFFFFFFFFFFF))
    return key[0]


def _laplace(h: np.ndarray) -> np.ndarray:
    u = (h >> np.uint64(11)).astype(np.float64) * 2.0**-53 + 2.0**-54  # (0, 1)
    centred = u - 0.5
    return -np.sign(centred) * np.log1p(-2.0 * np.abs(centred))


@dataclass(frozen=True)
class DataKnobs:
    """What shapes a generated data set besides its seed (defaults: today's rows, 22% CTR).

    Args:
        click_rate: the mean planted probability the bias is solved for, in [0.001, 0.6].
        signal: standard deviation of the planted logit (before the bias), in [0.2, 4];
            larger means a higher Bayes AUC.
        zipf: mean Zipf exponent of the id frequencies over slots (each slot keeps its
            offset from 1.275, the default's mean), in [0.6, 3]; larger means more head.
        rare_power: a value's weight is damped by ``(1 + rank / 100) ** -rare_power``, in
            [0, 2]; 0 leaves as much signal in rare ids as in frequent ones.
        label_noise: share of labels drawn at ``click_rate`` whatever the features, [0, 0.9].
        missing: factor on every slot's and dense feature's missing rate, in [0, 2]
            (rates capped at 0.95).
    """

    click_rate: float = TARGET_CTR
    signal: float = LOGIT_SD
    zipf: float = ZIPF_MEAN
    rare_power: float = RARE_POWER
    label_noise: float = 0.0
    missing: float = 1.0

    _RANGES = {
        "click_rate": (0.001, 0.6),
        "signal": (0.2, 4.0),
        "zipf": (0.6, 3.0),
        "rare_power": (0.0, 2.0),
        "label_noise": (0.0, 0.9),
        "missing": (0.0, 2.0),
    }

    def __post_init__(self) -> None:
        for name, (low, high) in self._RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
                raise ConfigError(f"{name}: expected a number in [{low}, {high}], got {value!r}")
            if not low <= value <= high:
                raise ConfigError(f"{name}: expected a number in [{low}, {high}], got {value!r}")
            object.__setattr__(self, name, float(value))

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self._RANGES}


@dataclass(frozen=True)
class PlantedModel:
    """The ground truth behind a generated data set (see the module docstring)."""

    seed: int
    exponent: np.ndarray  # [26] power-law exponents
    missing: np.ndarray  # [26] missing rates
    scale: np.ndarray  # [26] weight scales
    cross_scale: np.ndarray  # [len(CROSSES)]
    dense_mu: np.ndarray  # [13]
    dense_sigma: np.ndarray
    dense_missing: np.ndarray
    dense_beta: np.ndarray
    dense_centre: np.ndarray
    bias: float
    drift: float = 0.0
    knobs: DataKnobs = DataKnobs()


def _weights(model: PlantedModel, field: int, values: np.ndarray, day: int) -> np.ndarray:
    """The weight of each value of a field (slot or cross) on ``day``."""
    first = _laplace(_mix64(values ^ _key(model.seed, field, 1)))
    if model.drift == 0.0 or day == 0:
        return first
    second = _laplace(_mix64(values ^ _key(model.seed, field, 2)))
    angle = model.drift * day
    return np.cos(angle) * first + np.sin(angle) * second


def planted_model(seed: int, *, drift: float = 0.0, knobs: DataKnobs | None = None) -> PlantedModel:
    """The planted model of ``seed`` (the bias is solved for ``knobs.click_rate``, 22% by
    default)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed: expected an integer >= 0, got {seed!r}")
    if not drift >= 0:
        raise ConfigError(f"drift: expected >= 0 (radians per day), got {drift!r}")
    knobs = knobs or DataKnobs()
    rng = np.random.default_rng([int(seed), 0])
    slots = len(CARDINALITIES)
    missing = np.where(
        rng.random(slots) < 0.3, rng.uniform(0.1, 0.45, slots), rng.uniform(0, 0.03, slots)
    )
    model = PlantedModel(
        seed=int(seed),
        exponent=rng.uniform(1.05, 1.5, slots),
        missing=missing,
        scale=rng.uniform(0.05, 0.32, slots),
        cross_scale=rng.uniform(0.15, 0.35, len(CROSSES)),
        dense_mu=rng.uniform(0.5, 3.0, NUM_DENSE),
        dense_sigma=rng.uniform(0.8, 1.8, NUM_DENSE),
        dense_missing=rng.choice([0.0, 0.02, 0.2, 0.45], NUM_DENSE),
        dense_beta=rng.normal(0.0, 0.2, NUM_DENSE),
        dense_centre=rng.uniform(0.5, 3.0, NUM_DENSE),
        bias=0.0,
        drift=float(drift),
        knobs=knobs,
    )
    # every knob at its default leaves the arrays untouched (the rows stay bit-identical)
    if knobs.zipf != ZIPF_MEAN:
        model = PlantedModel(
            **{**model.__dict__, "exponent": model.exponent - ZIPF_MEAN + knobs.zipf}
        )
    if knobs.missing != 1.0:
        model = PlantedModel(**{
            **model.__dict__, "missing": np.minimum(model.missing * knobs.missing, 0.95),
            "dense_missing": np.minimum(model.dense_missing * knobs.missing, 0.95),
        })  # fmt: skip
    calibration = _rows(model, 50_000, "calibration", 0, 0)
    # rescale every weight so the logit's spread (and so the Bayes AUC) is about the same
    # for every seed, then solve the bias for the CTR
    factor = knobs.signal / np.std(_logits(model, calibration, day=0))
    model = PlantedModel(**{
        **model.__dict__, "scale": model.scale * factor,
        "cross_scale": model.cross_scale * factor, "dense_beta": model.dense_beta * factor,
    })  # fmt: skip
    logits = _logits(model, calibration, day=0)
    low, high = -20.0, 20.0
    for _ in range(60):  # bisection: mean sigmoid(bias + logit) = click rate
        mid = (low + high) / 2
        low, high = (
            (mid, high)
            if np.mean(1 / (1 + np.exp(-(mid + logits)))) < knobs.click_rate
            else (low, mid)
        )
    return PlantedModel(**{**model.__dict__, "bias": (low + high) / 2})


@dataclass(frozen=True)
class Generated:
    """Generated rows (columnar) and their planted click probabilities."""

    label: np.ndarray  # int8 [n]
    dense: np.ndarray  # int64 [n, 13]
    dense_present: np.ndarray  # bool [n, 13]
    codes: np.ndarray  # uint32 [n, 26], value k of slot s written as 8 hex digits
    present: np.ndarray  # bool [n, 26]
    prob: np.ndarray  # float64 [n]

    def __len__(self) -> int:
        return int(self.label.size)


@dataclass(frozen=True)
class _Rows:
    values: np.ndarray  # int64 [n, 26] value index per slot
    present: np.ndarray
    dense: np.ndarray
    dense_present: np.ndarray
    rng: np.random.Generator


def _rows(model: PlantedModel, n: int, split: str, part: int, chunk: int) -> _Rows:
    rng = np.random.default_rng([model.seed, _SPLITS[split], part, chunk])
    vocab = np.array(CARDINALITIES, np.float64)
    a = model.exponent
    u = rng.random((n, vocab.size))
    # inverse CDF of a density ~ (x + 1) ** -a on [0, V)
    near_one = np.abs(a - 1.0) < 1e-6
    if near_one.any():  # the limit a -> 1: density ~ 1 / (x + 1), CDF log(x + 1) / log(V + 1)
        a = np.where(near_one, 2.0, a)
    tail = 1.0 - (vocab + 1.0) ** (1.0 - a)
    x = (1.0 - u * tail) ** (1.0 / (1.0 - a)) - 1.0
    if near_one.any():
        x = np.where(near_one, (vocab + 1.0) ** u - 1.0, x)
    values = np.minimum(x.astype(np.int64), np.array(CARDINALITIES) - 1)
    present = rng.random((n, vocab.size)) >= model.missing
    z = rng.standard_normal((n, NUM_DENSE))
    dense = np.floor(np.exp(model.dense_mu + model.dense_sigma * z)).astype(np.int64) - 1
    dense_present = rng.random((n, NUM_DENSE)) >= model.dense_missing
    return _Rows(values, present, dense, dense_present, rng)


def _logits(model: PlantedModel, rows: _Rows, *, day: int) -> np.ndarray:
    values = rows.values.astype(np.uint64)
    logit = np.zeros(values.shape[0])
    for s in range(values.shape[1]):
        logit += _slot_term(model, rows, s, day)
    for c, (a, b) in enumerate(CROSSES):
        pair = values[:, a] * np.uint64(1 << 24) ^ values[:, b]
        w = (
            _weights(model, 1000 + c, pair, day)
            * _damping(model, rows.values[:, a])
            * _damping(model, rows.values[:, b])
        )
        both = rows.present[:, a] & rows.present[:, b]
        logit += model.cross_scale[c] * np.where(both, w, 0.0)
    feature = np.where(rows.dense_present, np.log1p(np.maximum(rows.dense, 0)), 0.0)
    logit += (feature - model.dense_centre) @ model.dense_beta
    return logit


def _slot_term(model: PlantedModel, rows: _Rows, s: int, day: int) -> np.ndarray:
    """Slot ``s``'s share of the logit of each row (0 where the slot is missing)."""
    values = rows.values[:, s]
    w = _weights(model, s, values.astype(np.uint64), day) * _damping(model, values)
    return model.scale[s] * np.where(rows.present[:, s], w, 0.0)


def _damping(model: PlantedModel, ranks: np.ndarray) -> np.ndarray:
    return (1.0 + ranks / RARE_SCALE) ** -model.knobs.rare_power


def probability(model: PlantedModel, logit: np.ndarray) -> np.ndarray:
    """The planted click probability of rows whose logit (bias included) is ``logit``."""
    prob = 1.0 / (1.0 + np.exp(-logit))
    noise = model.knobs.label_noise
    return prob if noise == 0.0 else (1.0 - noise) * prob + noise * model.knobs.click_rate


def rare_signal_share(model: PlantedModel, rows: int = 50_000) -> float:
    """Share of the slots' logit variance (sum of squared per-slot terms) carried by values
    past frequency rank ``RARE_RANK`` of their slot, on ``rows`` calibration rows."""
    sample = _rows(model, rows, "calibration", 1, 0)
    total = rare = 0.0
    for s in range(len(CARDINALITIES)):
        term = _slot_term(model, sample, s, 0) ** 2
        total += float(term.sum())
        rare += float(term[sample.values[:, s] >= RARE_RANK].sum())
    return rare / total if total else 0.0


def _codes(model: PlantedModel, values: np.ndarray) -> np.ndarray:
    """A bijection of each slot's value index onto 32 bits (the written hex string)."""
    x = values.astype(np.uint32)
    salt = np.array(
        [_key(model.seed, s, 3) & 0xFFFFFFFF for s in range(values.shape[1])], np.uint32
    )
    x = x ^ salt
    x = x * np.uint32(0x9E3779B1)  # odd multipliers and xor-shifts are invertible mod 2**32
    x ^= x >> np.uint32(15)
    x = x * np.uint32(0x85EBCA77)
    x ^= x >> np.uint32(13)
    return x


def generate(rows: int, seed: int, *, split: str = "train", part: int = 0, chunk: int = 0,
             day: int = 0, drift: float = 0.0, model: PlantedModel | None = None) -> Generated:  # fmt: skip
    """Generate ``rows`` samples of the planted model of ``seed``.

    Args:
        rows: how many samples.
        seed: the planted model (and, with split/part/chunk, the rows' random stream).
        split: ``train`` or ``test`` (independent streams, same model).
        part, chunk: further stream coordinates (a file and a piece of it).
        day: the day of a drifting model (0 = the base model).
        drift: radians per day the weights rotate (0 = no drift).
        model: a model already built with :func:`planted_model` (saves the solve).
    """
    if split not in ("train", "test"):
        raise ConfigError(f"split: expected 'train' or 'test', got {split!r}")
    if isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows < 0:
        raise ConfigError(f"rows: expected an integer >= 0, got {rows!r}")
    model = model or planted_model(seed, drift=drift)
    sample = _rows(model, int(rows), split, part, chunk)
    prob = probability(model, model.bias + _logits(model, sample, day=day))
    label = (sample.rng.random(int(rows)) < prob).astype(np.int8)
    return Generated(
        label,
        sample.dense,
        sample.dense_present,
        _codes(model, sample.values),
        sample.present,
        prob,
    )


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_SHIFTS = np.arange(28, -4, -4, dtype=np.uint32)


def _hex_column(codes: np.ndarray, present: np.ndarray) -> pa.Array:
    """8-hex-digit strings of uint32 codes, null where absent (no Python per value)."""
    n = codes.size
    chars = _HEX[(codes[:, None] >> _SHIFTS) & np.uint32(15)]
    offsets = np.arange(0, 8 * n + 1, 8, dtype=np.int64)
    validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()), validity, int(n - present.sum())
    )


def to_table(data: Generated) -> pa.Table:
    """The rows as an arrow table in Criteo column order (label, I1..I13, C1..C26)."""
    columns = [pa.array(data.label)]
    names = ["label"]
    for j in range(NUM_DENSE):
        columns.append(pa.array(data.dense[:, j], mask=~data.dense_present[:, j]))
        names.append(f"I{j + 1}")
    for s in range(data.codes.shape[1]):
        columns.append(_hex_column(np.ascontiguousarray(data.codes[:, s]), data.present[:, s]))
        names.append(f"C{s + 1}")
    return pa.table(columns, names=names)


CHUNK_ROWS = 250_000  # rows generated and written at a time (bounds memory)


def write_dataset(out, rows: int, seed: int, *, files: int = 1, test_rows: int | None = None,
                  day: int = 0, drift: float = 0.0, knobs: DataKnobs | None = None) -> dict:  # fmt: skip
    """Write ``out/train/part-*.tsv`` (``files`` files), ``out/test/part-00000.tsv`` and
    ``out/meta.json``.

    Args:
        out: the output folder (created; existing part files are replaced).
        rows: train rows, split as evenly as possible over ``files`` files.
        seed: the planted model and the rows.
        files: number of train files.
        test_rows: test rows (default ``max(rows // 10, 1000)``).
        day, drift: see :func:`generate`.
        knobs: click rate, signal, Zipf exponent, rare ids' share, label noise and missing
            rates (:class:`DataKnobs`; default: today's data).

    Returns:
        the metadata written to ``meta.json``: rows, test_rows, files, seed, day, drift,
        knobs, ctr_train, ctr_test, bayes_auc_train, bayes_auc_test (the planted model's
        exact AUC on the rows written), rare_signal_share (:func:`rare_signal_share`),
        bayes_logloss_test (the planted model's logloss on the test rows), paths and the
        format.
    """
    import json
    from pathlib import Path

    import pyarrow.csv as pacsv

    from ..metrics.functions import exact_auc

    if isinstance(files, bool) or not isinstance(files, int) or files < 1:
        raise ConfigError(f"files: expected an integer >= 1, got {files!r}")
    test_rows = max(rows // 10, 1000) if test_rows is None else test_rows
    if not isinstance(test_rows, int) or test_rows < 0:
        raise ConfigError(f"test_rows: expected an integer >= 0, got {test_rows!r}")
    out = Path(out)
    model = planted_model(seed, drift=drift, knobs=knobs)
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    result: dict = {"format": "criteo_tsv", "rows": int(rows), "test_rows": int(test_rows),
                    "files": files, "seed": int(seed), "day": int(day), "drift": float(drift),
                    "knobs": model.knobs.as_dict(), "rare_signal_share": rare_signal_share(model)}  # fmt: skip
    for split, total, count in (("train", rows, files), ("test", test_rows, 1)):
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("part-*.tsv"):
            old.unlink()
        labels, probs, paths = [], [], []
        for part, size in enumerate(np.diff(np.linspace(0, total, count + 1).astype(np.int64))):
            path = folder / f"part-{part:05d}.tsv"
            schema = to_table(generate(0, seed, model=model)).schema
            # a crash or a failure never leaves a half-written part-*.tsv
            with (
                replaced_atomically(path) as tmp,
                pacsv.CSVWriter(str(tmp), schema, write_options=options) as w,
            ):
                for chunk, start in enumerate(range(0, int(size), CHUNK_ROWS)):
                    n = min(CHUNK_ROWS, int(size) - start)
                    data = generate(
                        n, seed, split=split, part=part, chunk=chunk, day=day, model=model
                    )
                    w.write_table(to_table(data))
                    labels.append(data.label)
                    probs.append(data.prob)
            paths.append(str(path))
        label = np.concatenate(labels) if labels else np.empty(0, np.int8)
        prob = np.concatenate(probs) if probs else np.empty(0)
        result[f"ctr_{split}"] = float(label.mean()) if label.size else float("nan")
        result[f"bayes_auc_{split}"] = exact_auc(prob, label) if label.size else float("nan")
        if split == "test":  # (no test rows: no logloss, and no numpy warning for it)
            clipped = np.clip(prob, 1e-12, 1 - 1e-12)
            result["bayes_logloss_test"] = (
                float(-np.mean(label * np.log(clipped) + (1 - label) * np.log1p(-clipped)))
                if label.size
                else float("nan")
            )
        result[f"{split}_files"] = paths
    (out / "meta.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
