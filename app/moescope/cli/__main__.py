"""``python -m moescope.cli``: same as the ``moescope`` console script."""

import sys

from moescope.cli import main

sys.exit(main())
