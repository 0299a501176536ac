# ruff: noqa: SIM108  (kept as the Paddle script has it: a port changes the import line only)
"""PaddleRec's Criteo reader for Paddle PS (``models/rank/*/queuedataset_reader.py``), ported.

The only change from the Paddle script is the import line: sparseps.data has the same
``MultiSlotDataGenerator`` (same methods, same output). It reads PaddleRec's slot text
(``click:0 dense_feature:0.1 ... 1:737395 2:210498 ...``) on stdin and prints Paddle's
multislot text: ``click`` (1 value), the slots ``1``..``26`` (1 id each, 0 = padding),
``dense_feature`` (13 values), in that order. The dataset reads it with
``format="multislot"`` and a schema whose ``multislot_order`` is that order (train.py).

Debug: python reader.py < ../../tests/fixtures/criteo_slot_sample.txt | head -2
"""

# import paddle.distributed.fleet as fleet
import sparseps.data as fleet


class Reader(fleet.MultiSlotDataGenerator):
    def init(self):
        padding = 0
        sparse_slots = "click " + " ".join(str(i) for i in range(1, 27))
        self.sparse_slots = sparse_slots.strip().split(" ")
        self.dense_slots = ["dense_feature"]
        self.dense_slots_shape = [13]
        self.slots = self.sparse_slots + self.dense_slots
        self.slot2index = {}
        self.visit = {}
        for i in range(len(self.slots)):
            self.slot2index[self.slots[i]] = i
            self.visit[self.slots[i]] = False
        self.padding = padding

    def line_process(self, line):
        line = line.strip().split(" ")
        output = [(i, []) for i in self.slots]
        for i in line:
            slot_feasign = i.split(":")
            slot = slot_feasign[0]
            if slot not in self.slots:
                continue
            if slot in self.sparse_slots:
                feasign = int(slot_feasign[1])
            else:
                feasign = float(slot_feasign[1])
            output[self.slot2index[slot]][1].append(feasign)
            self.visit[slot] = True
        for i in self.visit:
            slot = i
            if not self.visit[slot]:
                if i in self.dense_slots:
                    # PaddleRec indexes dense_slots_shape by the slot's position among all
                    # slots, out of range for this layout; by its place among dense slots:
                    output[self.slot2index[i]][1].extend(
                        [self.padding]
                        * self.dense_slots_shape[self.slot2index[i] - len(self.sparse_slots)]
                    )
                else:
                    output[self.slot2index[i]][1].extend([self.padding])
            else:
                self.visit[slot] = False
        return output

    def generate_sample(self, line):
        "Dataset Generator"

        def reader():
            output_list = self.line_process(line)
            yield output_list

        return reader


if __name__ == "__main__":
    r = Reader()
    r.init()
    r.run_from_stdin()
