"""``python -m lockstep.cli``: the ``lockstep`` command."""

import sys

from lockstep.cli import main

sys.exit(main())
