"""A training loop that reads slowly, so its DataLoader workers fill the result pipe.

Prints ``READY`` once it holds batches; the test then kills this process.
"""

import sys
import time

from torch_dataloader_utils import create_dataloader

loader, _ = create_dataloader(
    sys.argv[1], num_workers=2, batch_size=64, output_format=sys.argv[2], num_ranks=1, rank=0
)
for i, _batch in enumerate(loader):
    if i == 2:
        print("READY", flush=True)
    time.sleep(1.0)
