"""``python -m torch_dataloader_utils``."""

import sys

from torch_dataloader_utils.cli import main

sys.exit(main())
