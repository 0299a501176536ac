"""Paddle's data generator classes, so a Paddle generator script runs as a ``pipe_command``.

A Paddle job's reader script subclasses ``fleet.MultiSlotDataGenerator`` (or
``MultiSlotStringDataGenerator``) and ends with ``run_from_stdin()``. Change its import
line and it runs unchanged under sparseps, printing exactly the bytes Paddle's class
prints::

    # import paddle.distributed.fleet as fleet
    import sparseps.data as fleet

    class Reader(fleet.MultiSlotDataGenerator):
        def generate_sample(self, line):
            def reader():
                label, dense, ids = parse(line)
                yield zip(["click", "dense", *SLOTS], [[label], dense, *ids])
            return reader

    if __name__ == "__main__":
        Reader().run_from_stdin()

and the dataset reads its output with ``format="multislot"`` (``"multislot_string"`` for
the string class), ``schema.multislot_order`` giving the names in the order the
generator yields them (:mod:`sparseps.data.multislot`).

The behaviour is Paddle 2.6's (``python/paddle/distributed/fleet/data_generator/
data_generator.py``), checked byte for byte against it by
``tests/data/test_paddle_generator_parity.py`` and PaddleRec's own readers
(``tests/fixtures/paddlerec/``):

- ``generate_sample(line)`` returns a function that returns an iterator of samples; a
  sample is a list, a tuple or a ``zip`` of ``(name, values)`` pairs (a zip is made a
  list, as Paddle does); ``None`` is skipped;
- samples are gathered into batches of ``set_batch(n)`` (default 32) and handed to
  ``generate_batch(samples)`` (default: the samples unchanged), the last batch short;
- ``run_from_stdin()`` calls ``generate_sample`` once per line of stdin (with its
  newline), ``run_from_memory()`` once with ``None``;
- each sample of ``generate_batch`` is written to ``sys.stdout`` as soon as it is made,
  so whatever the script itself prints lands where it lands under Paddle.

Checks are Paddle's, messages included, with one difference: numpy integers and
numpy floats that are not Python floats (``np.int64``, ``np.float32``) are numbers here
(Paddle refuses them). As in Paddle, a ``bool`` is an int and prints as ``True``/``False``
(which no multislot reader reads as a number), and once a slot holds a float its values
are printed without a check.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["DataGenerator", "MultiSlotDataGenerator", "MultiSlotStringDataGenerator"]

_NOT_A_SEQUENCE = "the output of process() must be in list or tuple type"


class DataGenerator:
    """The base class: batching and the stdin/memory loops; subclasses format a sample.

    Attributes:
        batch_size_: how many samples :meth:`generate_batch` receives (Paddle's name;
            scripts may set it directly).
    """

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
        raise NotImplementedError("pls use MultiSlotDataGenerator or PairWiseDataGenerator")

    def run_from_stdin(self) -> None:
        """Read lines from stdin, write their samples to stdout (a ``pipe_command``)."""
        self._run(sys.stdin)

    def run_from_memory(self) -> None:
        """Write the samples of ``generate_sample(None)`` (for generators that make data)."""
        self._run([None])

    def _run(self, lines: Iterable[str | None]) -> None:
        batch: list = []
        for line in lines:
            for sample in self.generate_sample(line)():
                if sample is None:
                    continue
                batch.append(sample)
                if len(batch) == self.batch_size_:
                    self._write(batch)
                    batch = []
        if batch:
            self._write(batch)

    def _write(self, samples: list) -> None:
        for sample in self.generate_batch(samples)():
            sys.stdout.write(self._gen_str(sample))


def _fields(line: Any, example: str) -> list | tuple:
    """A sample as a list or tuple of ``(name, values)`` (a zip becomes a list).

    Raises:
        ValueError: anything else (Paddle's message).
    """
    if isinstance(line, zip):
        return list(line)
    if not isinstance(line, list | tuple):
        raise ValueError(_NOT_A_SEQUENCE + example)
    return line


class MultiSlotStringDataGenerator(DataGenerator):
    """Samples of strings: ``[(name, ["a", "b"]), ...]`` -> ``2 a b ...``; an empty list
    prints ``0``. No checks (as in Paddle). Read with ``format="multislot_string"``
    (ids hashed per slot)."""

    def _gen_str(self, line: Any) -> str:
        parts: list[str] = []
        for item in _fields(line, "Examples: [('words', ['1926', '08', '17']), ('label', ['1'])]"):
            _, elements = item
            parts.append(str(len(elements)))
            parts.extend(elements)
        return " ".join(parts) + "\n"


class MultiSlotDataGenerator(DataGenerator):
    """Samples of numbers: ``[(name, [1, 2]), ("dense", [0.5])]`` -> ``2 1 2 1 0.5``.

    As in Paddle: names must be strings, values non-empty lists (pad in
    ``generate_sample``), every sample must have the first sample's names in its order,
    and a value is an int or a float (a slot with a float is a float slot, whose values
    are not checked after that).
    """

    def _gen_str(self, line: Any) -> str:
        line = _fields(line, "Example: [('words', [1926, 08, 17]), ('label', [1])]")
        proto = self._proto_info
        first = proto is None
        if proto is None:
            proto = self._proto_info = []
        elif len(line) != len(proto):
            raise ValueError("the complete field set of two given line are inconsistent.")
        parts: list[str] = []
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
            if not first and proto[index][1] == "float":
                parts.extend(map(str, elements))  # Paddle checks no value of a float slot
                continue
            for elem in elements:
                # the first sample checks every value; later ones until the slot is float
                if first or proto[index][1] != "float":
                    text, is_float = _number(elem)
                    if is_float:
                        proto[index] = (name, "float")
                    parts.append(text)
                else:
                    parts.append(str(elem))
        return " ".join(parts) + "\n"


def _number(elem: object) -> tuple[str, bool]:
    """``(text, is_float)`` of a value of a slot that is not (yet) a float slot.

    Raises:
        ValueError: not an int or a float (Paddle's message).
    """
    if isinstance(elem, float):
        return str(elem), True
    if isinstance(elem, int):
        return str(elem), False  # bool included: True prints as "True", as in Paddle
    if isinstance(elem, numbers.Integral):  # numpy integers (Paddle refuses them)
        return str(int(elem)), False
    if isinstance(elem, numbers.Real):  # numpy floats that are not Python floats
        return str(float(elem)), True
    raise ValueError(f"the type of element{type(elem)} must be in int or float")
