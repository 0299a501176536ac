"""Paddle's data generator classes, so a Paddle generator script runs as a ``pipe_command``.

A Paddle job's reader script subclasses ``fleet.MultiSlotDataGenerator`` (or
``MultiSlotStringDataGenerator``) and ends with ``run_from_stdin()``. Change its import
line and it runs unchanged under sparseps, printing exactly what Paddle's class prints::

    # import paddle.distributed.fleet as fleet
    import sparseps.data as fleet

    class Reader(fleet.MultiSlotDataGenerator):
        def generate_sample(self, line):
            def reader():
                label, dense, ids = parse(line)
                yield [("click", [label]), ("dense", dense), *zip(SLOTS, ids)]
            return reader

    if __name__ == "__main__":
        Reader().run_from_stdin()

and the dataset reads its output with ``format="multislot"`` (``"multislot_string"`` for
the string class), ``schema.multislot_order`` giving the names in the order the
generator yields them (:mod:`sparseps.data.multislot`).

The methods are Paddle's: ``generate_sample(line)`` returns a function that returns an
iterator of samples (a sample is a list or tuple of ``(name, [values])``; ``None`` is
skipped), ``generate_batch(samples)`` the same for a batch of ``set_batch(n)`` samples
(default: the samples unchanged), ``run_from_stdin()`` reads lines from stdin,
``run_from_memory()`` calls ``generate_sample(None)`` once. Output is written in blocks
(Paddle writes a line at a time; the bytes are the same).

Checks are Paddle's, with one difference: numpy integers and floats are accepted as
numbers (Paddle accepts only ``int``/``float``), and a ``bool`` prints as ``0``/``1``.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

__all__ = ["DataGenerator", "MultiSlotDataGenerator", "MultiSlotStringDataGenerator"]

_FLUSH_LINES = 1024


class DataGenerator:
    """The base class: batching and the stdin/memory loops; subclasses format a sample."""

    def __init__(self) -> None:
        self._proto_info: list[tuple[str, str]] | None = None
        self.batch_size_ = 32

    def set_batch(self, batch_size: int) -> None:
        """How many samples :meth:`generate_batch` receives at a time."""
        self.batch_size_ = batch_size

    def generate_sample(self, line: str | None) -> Callable[[], Iterator[Any]]:
        """Override: return a function returning an iterator of samples for ``line``."""
        raise NotImplementedError(
            "Please rewrite this function to return a list or tuple: "
            "[(name, [feasign, ...]), ...] or ((name, [feasign, ...]), ...)"
        )

    def generate_batch(self, samples: list) -> Callable[[], Iterator[Any]]:
        """Override to rework a batch of samples; by default yields them unchanged."""

        def local_iter() -> Iterator[Any]:
            yield from samples

        return local_iter

    def _gen_str(self, line: Any) -> str:
        raise NotImplementedError("use MultiSlotDataGenerator or MultiSlotStringDataGenerator")

    def _emit(self, samples: list, out: list[str]) -> None:
        for sample in self.generate_batch(samples)():
            out.append(self._gen_str(sample))

    def _run(self, lines: Iterable[str | None], stdout: TextIO) -> None:
        batch: list = []
        out: list[str] = []
        for line in lines:
            for sample in self.generate_sample(line)():
                if sample is None:
                    continue
                batch.append(sample)
                if len(batch) == self.batch_size_:
                    self._emit(batch, out)
                    batch = []
                    if len(out) >= _FLUSH_LINES:
                        stdout.write("".join(out))
                        out = []
        if batch:
            self._emit(batch, out)
        stdout.write("".join(out))
        stdout.flush()

    def run_from_stdin(self) -> None:
        """Read lines from stdin, write their samples to stdout (a ``pipe_command``)."""
        self._run(sys.stdin, sys.stdout)

    def run_from_memory(self) -> None:
        """Write the samples of ``generate_sample(None)`` (for generators that make data)."""
        self._run([None], sys.stdout)


def _check_sample(line: object) -> None:
    if not isinstance(line, list | tuple):
        raise ValueError(
            "the output of process() must be in list or tuple type"
            "Example: [('words', [1926, 08, 17]), ('label', [1])]"
        )


class MultiSlotStringDataGenerator(DataGenerator):
    """Samples of strings: ``[(name, ["a", "b"]), ...]`` -> ``2 a b ...`` (no checks,
    as in Paddle); read with ``format="multislot_string"`` (ids hashed per slot)."""

    def _gen_str(self, line: Any) -> str:
        _check_sample(line)
        return " ".join(f"{len(elements)} {' '.join(elements)}" if elements else "0"
                        for _, elements in line) + "\n"  # fmt: skip


class MultiSlotDataGenerator(DataGenerator):
    """Samples of numbers: ``[(name, [1, 2]), ("dense", [0.5])]`` -> ``2 1 2 1 0.5``.

    As in Paddle: names must be strings, values non-empty lists (pad in
    ``generate_sample``), every sample must have the same names in the same order, and a
    value is an int or a float (a slot with a float is a float slot).
    """

    def _gen_str(self, line: Any) -> str:
        _check_sample(line)
        proto = self._proto_info
        first = proto is None
        if proto is None:
            proto = self._proto_info = []
        elif len(line) != len(proto):
            raise ValueError("the complete field set of two given line are inconsistent.")
        parts = []
        for index, item in enumerate(line):
            name, elements = item
            if not isinstance(name, str):
                raise ValueError(f"name{type(name)} must be in str type")
            if not isinstance(elements, list):
                raise ValueError(f"elements{type(elements)} must be in list type")
            if not elements:
                raise ValueError(
                    "the elements of each field can not be empty, you need padding it in process()."
                )
            if first:
                proto.append((name, "uint64"))
            elif name != proto[index][0]:
                raise ValueError(
                    "the field name of two given line are not match: "
                    f"require<{proto[index][0]}>, get<{name}>."
                )
            parts.append(str(len(elements)))
            parts.append(" ".join(map(self._text, elements)))
            if proto[index][1] != "float" and any(
                isinstance(e, float | numbers.Real) and not isinstance(e, numbers.Integral)
                for e in elements
            ):
                proto[index] = (name, "float")
        return " ".join(parts) + "\n"

    @staticmethod
    def _text(elem: object) -> str:
        if isinstance(elem, bool):
            return "1" if elem else "0"
        if isinstance(elem, int | float):
            return str(elem)
        if isinstance(elem, numbers.Integral):
            return str(int(elem))
        if isinstance(elem, numbers.Real):
            return str(float(elem))
        raise ValueError(f"the type of element{type(elem)} must be in int or float")
