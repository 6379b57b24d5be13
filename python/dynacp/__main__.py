"""``python -m dynacp``: same as the ``dynacp`` console script."""

import sys

from dynacp.cli import main

sys.exit(main())
