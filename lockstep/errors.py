"""The root of every error lockstep raises on purpose.

An error lockstep means to raise (a file that cannot be used, a setting that is out of
range, a backend that cannot run here, a run that cannot be resumed) derives from
``LockstepError``, and its message is one line that names what is wrong and what to do.
Each also keeps the built-in base it always had (``ValueError``, ``RuntimeError``, ...),
so code that catches that base still does. The command line catches ``LockstepError``
and prints its one line; anything else is a bug and ends with its traceback. ``lockstep
--debug CMD`` (or ``LOCKSTEP_DEBUG=1``) prints the traceback of a ``LockstepError`` too.
"""

from __future__ import annotations


class LockstepError(Exception):
    """An error lockstep raises on purpose: its message is one line saying what is wrong and what to do."""
