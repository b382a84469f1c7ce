"""The root of every error lockstep raises on purpose.

An error lockstep means to raise (a file that cannot be used, a setting that is out of
range, a backend that cannot run here, a run that cannot be resumed) derives from
``LockstepError``, and its message is one line that names what is wrong and what to do.
Each also keeps the built-in base it always had (``ValueError``, ``RuntimeError``, ...),
so code that catches that base still does. The command line catches ``LockstepError``
and prints its one line; anything else is a bug and ends with its traceback. ``lockstep
--debug CMD`` (or ``LOCKSTEP_DEBUG=1``) prints the traceback of a ``LockstepError`` too.

A message that names a setting the caller gave (a target step count, a memory budget)
names it in the library's terms, by its keyword (``steps``, ``max_memory``), and keeps
which parts are settings (``LockstepError.naming``, ``Setting``): a front end words it
its own way (``worded``: the command line names its flags, ``--steps``), so the library
never speaks of flags. A layer that wraps another's error keeps the settings it names
(``LockstepError.like``; ``parts_of`` when it adds its own words).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass(frozen=True)
class Setting:
    """A setting a message names: ``name`` is its keyword in the library's calls (``steps``, ``max_memory``)."""

    name: str


def wording(parts: Iterable, name: Callable[[str], str] | None = None) -> str:
    """The text of message ``parts`` (strings and ``Setting`` values), each setting as ``name(setting)``
    (default: its keyword)."""
    return "".join((p.name if name is None else name(p.name)) if isinstance(p, Setting) else str(p) for p in parts)


def parts_of(exc: BaseException) -> tuple:
    """The message of ``exc`` as parts: the strings and settings of a ``LockstepError.naming``, else its text
    (a layer that adds its own words to another's error keeps the settings it names)."""
    return getattr(exc, "parts", ()) or (str(exc),)


class LockstepError(Exception):
    """An error lockstep raises on purpose: its message is one line saying what is wrong and what to do."""

    parts: tuple = ()  # the message as strings and Setting values, when it names settings (``naming``)

    @classmethod
    def naming(cls, *parts, **kwargs):
        """This error with a message of ``parts`` (strings and ``Setting`` values): its text names each
        setting by its keyword, and ``worded`` lets a front end name them its own way."""
        err = cls(wording(parts), **kwargs)
        err.parts = tuple(parts)
        return err

    @classmethod
    def like(cls, exc: BaseException, **kwargs):
        """This error with the message of ``exc`` (the settings it names kept): a layer that wraps another's error."""
        parts = getattr(exc, "parts", ())
        return cls.naming(*parts, **kwargs) if parts else cls(str(exc), **kwargs)

    @property
    def settings(self) -> tuple[str, ...]:
        """The keywords of the settings the message names (none: it names no setting)."""
        return tuple(p.name for p in self.parts if isinstance(p, Setting))

    def worded(self, name: Callable[[str], str]) -> str:
        """The message with each setting it names as ``name(setting)`` (the message itself when it names none)."""
        return wording(self.parts, name) if self.parts else str(self)
