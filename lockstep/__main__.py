"""``python -m lockstep``: the ``lockstep`` command."""

import sys

from lockstep.cli import main

sys.exit(main())
