"""``python -m streamloop``: the ``streamloop`` command."""

import sys

from streamloop.cli import main

sys.exit(main())
