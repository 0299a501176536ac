# ruff: noqa: B905  (zip without strict=, as Paddle scripts write it)
"""Generator scripts that use every method of Paddle's data generator classes.

Run as ``python paddle_generator_cases.py CASE < lines``. With ``GENERATOR=paddle`` it
imports Paddle's classes (``paddle.distributed.fleet``), otherwise sparseps' (the import
line a port changes), so tests/data/test_paddle_generator_parity.py runs each case under
both and compares the bytes. Each case is a generator script as a Paddle user writes one.
"""

import os
import sys

if os.environ.get("GENERATOR") == "paddle":
    import paddle.distributed.fleet as fleet
else:
    import sparseps.data as fleet

NAMES = ["label", "words", "weight"]


class Zips(fleet.MultiSlotDataGenerator):
    """``yield zip(names, values)``, as six of PaddleRec's readers do."""

    def generate_sample(self, line):
        def reader():
            words = [int(x) for x in line.split()]
            yield zip(NAMES, [[len(words) % 2], words or [0], [0.5 * len(words)]])

        return reader


class Shapes(fleet.MultiSlotDataGenerator):
    """A list, a tuple and a zip in turn; None is skipped; two samples from one line."""

    def generate_sample(self, line):
        def reader():
            words = [int(x) for x in line.split()] or [0]
            n = len(words)
            if n == 1:
                yield None
            kind = n % 3
            if kind == 0:
                yield [("label", [1]), ("words", words), ("weight", [n])]
            elif kind == 1:
                yield (("label", [0]), ("words", words), ("weight", [n / 4]))
            else:
                yield zip(NAMES, [[1], words, [n]])
                yield [("label", [0]), ("words", words[:1]), ("weight", [True])]

        return reader


class Batched(fleet.MultiSlotDataGenerator):
    """``set_batch(3)`` and a ``generate_batch`` that pads words to the batch's longest and
    records the batch's size: the batch boundaries show in the output."""

    def generate_sample(self, line):
        def reader():
            yield [("words", [int(x) for x in line.split()] or [0]), ("size", [0])]

        return reader

    def generate_batch(self, samples):
        def reader():
            longest = max(len(s[0][1]) for s in samples)
            for s in samples:
                words = s[0][1]
                yield [("words", words + [0] * (longest - len(words))), ("size", [len(samples)])]

        return reader


class DefaultBatch(Batched):
    """The default batch size (32): 70 samples make batches of 32, 32 and 6."""

    def generate_sample(self, line):
        def reader():
            for i in range(7):
                yield [("words", [int(x) + i for x in line.split()] or [i]), ("size", [0])]

        return reader


class Memory(fleet.MultiSlotDataGenerator):
    """``run_from_memory``: ``generate_sample(None)`` makes every sample."""

    def generate_sample(self, line):
        def reader():
            assert line is None
            for i in range(5):
                yield zip(["id", "score"], [[i, i * i], [i / 3]])

        return reader


class Strings(fleet.MultiSlotStringDataGenerator):
    """The string generator: zips, lists and tuples of strings; an empty slot prints 0."""

    def generate_sample(self, line):
        def reader():
            words = line.split()
            if len(words) % 3 == 0:
                yield zip(["label", "words"], [["1"], words])
            elif len(words) % 3 == 1:
                yield [("label", ["0"]), ("words", words)]
            else:
                yield (("label", ["1"]), ("words", []))

        return reader


class StringBatches(Strings):
    def generate_batch(self, samples):
        def reader():
            for sample in samples:
                yield list(sample) + [("batch", [str(len(samples))])]

        return reader


class Talks(fleet.MultiSlotDataGenerator):
    """A script that prints to stdout itself between samples: the order of the bytes."""

    def generate_sample(self, line):
        def reader():
            print("# read", line.strip())
            yield [("words", [int(x) for x in line.split()] or [0])]

        return reader

    def generate_batch(self, samples):
        def reader():
            print("# batch of", len(samples))
            yield from samples

        return reader


class Fails(fleet.MultiSlotDataGenerator):
    """A value that is not a number on the 4th line: what was printed before stays."""

    def generate_sample(self, line):
        def reader():
            words = line.split()
            yield [("words", [int(words[0]) if len(words) != 4 else words[0]] if words else [0])]

        return reader


def main(case):
    if case == "zips":
        Zips().run_from_stdin()
    elif case == "shapes":
        Shapes().run_from_stdin()
    elif case == "batched":
        gen = Batched()
        gen.set_batch(3)
        gen.run_from_stdin()
    elif case == "default_batch":
        DefaultBatch().run_from_stdin()
    elif case == "memory":
        gen = Memory()
        gen.set_batch(2)
        gen.run_from_memory()
    elif case == "strings":
        Strings().run_from_stdin()
    elif case == "string_batches":
        gen = StringBatches()
        gen.set_batch(4)
        gen.run_from_stdin()
    elif case == "talks":
        gen = Talks()
        gen.set_batch(2)
        gen.run_from_stdin()
    elif case == "fails":
        gen = Fails()
        gen.set_batch(1)
        gen.run_from_stdin()
    else:
        raise SystemExit(f"unknown case {case!r}")


if __name__ == "__main__":
    main(sys.argv[1])
