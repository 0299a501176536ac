"""slot_dnn's pipe reader: PaddleRec's slot_dnn lines to Paddle's multislot text.

The config's ``pipe_command`` runs it as PaddleRec runs its ``queuedataset_reader.py``
(``python3.7 queuedataset_reader.py CONFIG UTILS_DIR``, from the model's folder), and it
yields what that reader yields, written here for sparseps' ``MultiSlotDataGenerator``
(``sparseps.data``, Paddle's ``fleet.MultiSlotDataGenerator``):

- a line is ``feasign:slot`` tokens; slot ``1`` is the click (``0:1`` = no click,
  ``1:1`` = a click), slots ``2`` .. ``slot_num + 1`` the features;
- a sample is ``("0", [1])`` (the show), then ``("1", [click])`` and each feature slot
  in order with its feasigns, ``[0]`` (the padding id) when the line has none; tokens of
  other slots are skipped.

``slot_num`` is ``hyper_parameters.slot_num`` of the config passed as the first argument
(PaddleRec's reader writes 300, the config's value).
"""

from __future__ import annotations

import sys

import yaml

import sparseps.data as fleet  # Paddle: import paddle.distributed.fleet as fleet

PADDING = 0


class Reader(fleet.MultiSlotDataGenerator):
    def init(self, slot_num):
        # "1" is the click, then the feature slots, as the model's feeds
        self.slots = [str(i) for i in range(1, slot_num + 2)]

    def line_process(self, line):
        ids = {slot: [] for slot in self.slots}
        for token in line.split():
            feasign, _, slot = token.partition(":")
            if slot in ids:
                ids[slot].append(int(feasign))
        return [("0", [1])] + [(slot, found or [PADDING]) for slot, found in ids.items()]

    def generate_sample(self, line):
        def reader():
            yield self.line_process(line)

        return reader


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        config = yaml.safe_load(f)
    r = Reader()
    r.init(int(config["hyper_parameters"]["slot_num"]))
    r.run_from_stdin()
