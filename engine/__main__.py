"""``python -m engine``: the ``streamloop`` command."""

import sys

from engine.cli import main

sys.exit(main())
