"""Out-of-core state: float32 arrays in memory-mapped files of a scratch folder (``Execution.scratch``).

With a scratch folder the AdamW moments (``MomentFiles``) and the step tree's gradient
sums (``storage.VectorPool(..., scratch=...)``, chosen by ``storage.step_storage``) live in files instead of anonymous
memory. They are plain ``np.ndarray`` views of ``mmap`` objects, so every backend and
every numba kernel takes them as any other array, and no bit depends on where an
array lives (the tests compare trajectories with and without a scratch folder byte
for byte).

Safety. ``ScratchSpace(root)`` refuses a ``root`` that is a symbolic link or not a
directory, then makes its own private folder inside it (``tempfile.mkdtemp``: mode
0700, a fresh name). Each file is created there with ``O_EXCL | O_NOFOLLOW`` and mode
0600, sized, mapped, and unlinked at once: nothing is left behind even when the
process is killed, and no other process can open the files. ``close()`` removes the
private folder. Pages an array no longer needs in RAM are handed back with
``release`` (``madvise(MADV_DONTNEED)`` on the shared mapping: the data stays in the
file, and the next read faults it back in from the page cache or the disk).
"""

from __future__ import annotations

import mmap
import os
import stat
import tempfile

import numpy as np

from lockstep.formats.config import ConfigError
from lockstep.fsio import create_exclusive_at

PAGE = mmap.PAGESIZE


class ScratchSpace:
    """A private folder inside ``root`` holding memory-mapped float32 arrays."""

    def __init__(self, root: str | os.PathLike):
        root = os.fspath(root)
        try:
            st = os.lstat(root)
        except FileNotFoundError:
            raise ConfigError(f"scratch folder {root!r} does not exist; create it first") from None
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError(f"scratch folder {root!r} is a symbolic link; name the real folder")
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"scratch folder {root!r} is not a directory")
        self.dir = tempfile.mkdtemp(prefix="lockstep-scratch-", dir=root)  # 0700, ours alone
        self._dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
        self._count = 0
        self._maps: dict[int, tuple[np.ndarray, mmap.mmap]] = {}  # id(array) -> (array, its mapping)
        self.bytes = 0  # bytes mapped so far (tests and benchmarks)

    def array(self, n: int) -> np.ndarray:
        """A new float32 array of ``n`` elements backed by a file of this space (zero-filled)."""
        if self._dir_fd < 0:
            raise ValueError("the scratch space is closed")
        n = int(n)
        nbytes = max(4 * n, 1)
        name = f"{self._count:06d}.f32"
        self._count += 1
        fd = create_exclusive_at(self._dir_fd, name, 0o600)
        try:
            os.unlink(name, dir_fd=self._dir_fd)  # ours alone, and gone whatever happens to the process
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        a = np.frombuffer(mm, dtype=np.float32, count=n)
        self._maps[id(a)] = (a, mm)
        self.bytes += nbytes
        return a

    def owns(self, a) -> bool:
        held = self._maps.get(id(a))
        return held is not None and held[0] is a

    def _owner(self, a):
        """The array of this space that ``a`` is (or is a view of), or None."""
        while isinstance(a, np.ndarray) and not self.owns(a) and isinstance(a.base, np.ndarray):
            a = a.base
        return a if isinstance(a, np.ndarray) and self.owns(a) else None

    def release(self, *arrays) -> None:
        """Hand the pages of these arrays back to the system; their values stay in the files.

        An array of this space, or a contiguous view of one (a moment reshaped to its tensor's
        shape, one gradient's slice of a step vector), releases the whole pages inside its bytes
        (all of them for the whole array), so the values around it that share a page stay resident.
        Anything else is left alone."""
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if advice is None:
            return
        for a in arrays:
            owner = self._owner(a)
            if owner is None:
                continue
            mm = self._maps[id(owner)][1]
            if not a.flags.c_contiguous or a.nbytes == 0:
                continue
            start = a.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
            lo = -(-start // PAGE) * PAGE                 # the first whole page inside the view
            hi = (start + a.nbytes) // PAGE * PAGE         # the end of the last whole page inside it
            if start + a.nbytes >= owner.nbytes:
                hi = len(mm)                               # the view ends the file: its last, partial page too
            if hi > lo:
                mm.madvise(advice, lo, hi - lo)

    def release_all(self) -> None:
        self.release(*(a for a, _ in self._maps.values()))

    def close(self) -> None:
        """Forget the arrays (their mappings go with the last reference) and remove the private folder."""
        if self._dir_fd < 0:
            return
        self._maps.clear()
        os.close(self._dir_fd)
        self._dir_fd = -1
        os.rmdir(self.dir)  # the files were unlinked when made

    def __enter__(self) -> "ScratchSpace":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


class MomentFiles:
    """The AdamW moments in a scratch space: two slots, step ``t`` writing slot ``t % 2``.

    ``place(t)`` is ``optimizer_step``'s ``place``: each new moment is copied into its
    file as soon as it is computed, and its pages and those of the moment it replaces
    are released, so at most one tensor's moments are in RAM at a time. The previous
    step's moments (the other slot) are never written over, so the state the update
    started from stays intact until the next step.
    """

    def __init__(self, space: ScratchSpace):
        self.space = space
        self._slots: dict[tuple[int, str, str], np.ndarray] = {}

    def _file(self, slot: int, kind: str, name: str, shape) -> np.ndarray:
        key = (slot, kind, name)
        a = self._slots.get(key)
        if a is None:
            a = self.space.array(int(np.prod(shape, dtype=np.int64)))
            self._slots[key] = a
        return a.reshape(shape)

    def _put(self, slot: int, kind: str, name: str, value) -> np.ndarray:
        value = np.asarray(value, dtype=np.float32)
        dst = self._file(slot, kind, name, value.shape)
        np.copyto(dst, value)
        self.space.release(self._slots[(slot, kind, name)])
        other = self._slots.get((1 - slot, kind, name))
        if other is not None:
            self.space.release(other)
        return dst

    def place(self, t: int):
        """``place(kind, name, value) -> array`` for the update that makes step ``t``'s moments."""
        slot = t % 2
        return lambda kind, name, value: self._put(slot, kind, name, value)

    def adopt(self, opt):
        """``opt`` (an ``AdamWState``) with its moments copied into slot ``opt.step % 2``."""
        from lockstep.formats.state import AdamWState

        slot = opt.step % 2
        m = {k: self._put(slot, "m", k, v) for k, v in opt.m.items()}
        v = {k: self._put(slot, "v", k, x) for k, x in opt.v.items()}
        return AdamWState(opt.step, m, v)

    def release(self) -> None:
        self.space.release(*self._slots.values())
