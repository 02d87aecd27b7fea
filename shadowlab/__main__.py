"""``python -m shadowlab`` is the ``shadowlab`` command."""

import sys

from shadowlab.cli import main

sys.exit(main())
