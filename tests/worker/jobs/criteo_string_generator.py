"""A Paddle-style generator script (MultiSlotStringDataGenerator) for raw Criteo TSV.

Written as a Paddle user writes one; only the import line names sparseps. It passes the
text through: label, I1..I13 (missing -> "0"), C1..C26 (missing -> no id), so reading its
output with format="multislot_string" and schema CRITEO gives exactly the batches of the
TSV read (the hex strings are hashed with the same slot seeds).
"""

# import paddle.distributed.fleet as fleet
import sparseps.data as fleet

DENSE = [f"I{i}" for i in range(1, 14)]
SLOTS = [f"C{i}" for i in range(1, 27)]


class CriteoReader(fleet.MultiSlotStringDataGenerator):
    def generate_sample(self, line):
        def reader():
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 40:
                return
            sample = [("label", [fields[0]])]
            sample += [(name, [x or "0"]) for name, x in zip(DENSE, fields[1:14], strict=True)]
            sample += [(name, [x] if x else []) for name, x in zip(SLOTS, fields[14:], strict=True)]
            yield sample

        return reader


if __name__ == "__main__":
    CriteoReader().run_from_stdin()
