"""Out-of-core state (``Execution.scratch``): the AdamW moments and the tree's sums in memory-mapped
files give byte-identical trajectories, and the scratch folder is private, refused when it is a link,
and left empty."""

import os
import stat

import numpy as np
import pytest

from lockstep.backends import BackendUnavailable, get_backend
from lockstep.formats.config import preset, train_preset
from lockstep.train.execution import Execution
from lockstep.train.scratch import MomentFiles, ScratchSpace
from lockstep.train.storage import VectorPool
from lockstep.train.trainer import train

QUIET = {"progress": False, "log": lambda *a: None}


def _opencl_or_skip():
    try:
        get_backend("opencl")
    except BackendUnavailable as e:  # pragma: no cover - CI installs pyopencl[pocl]
        pytest.skip(f"opencl backend unavailable: {e}")


def _files(run_dir):
    """Every file of a run except the metrics log (it records seconds), with its bytes."""
    out = {}
    for root, _, names in os.walk(run_dir):
        for n in names:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, run_dir)
            if n != "metrics.jsonl" and not rel.startswith("data"):
                with open(p, "rb") as f:
                    out[rel] = f.read()
    return out


def test_scratch_space_is_private_refuses_links_and_leaves_nothing(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(ValueError, match="symbolic link"):
        ScratchSpace(link)
    with pytest.raises(ValueError, match="does not exist"):
        ScratchSpace(tmp_path / "absent")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ValueError, match="not a directory"):
        ScratchSpace(tmp_path / "file")
    with ScratchSpace(tmp_path) as space:
        assert stat.S_IMODE(os.stat(space.dir).st_mode) == 0o700
        a = space.array(5000)
        assert type(a) is np.ndarray and a.dtype == np.float32 and not a.any()
        assert os.listdir(space.dir) == []  # the files were unlinked once mapped
        a[:] = np.arange(5000, dtype=np.float32)
        space.release(a, a[10:].reshape(10, -1)[0])  # the pages go; the values stay in the file
        assert np.array_equal(a, np.arange(5000, dtype=np.float32))
        private = space.dir
    assert not os.path.exists(private)
    assert sorted(os.listdir(tmp_path)) == ["file", "link"]


def _resident_pages(a: np.ndarray) -> int:
    """Pages of the array's mapping resident in this process (its ``Rss`` in ``/proc/self/smaps``; the
    page cache does not count): the array starts its own mapping."""
    import mmap

    start, lines = f"{a.ctypes.data:x}-", open("/proc/self/smaps").read().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(start))
    rss = next(line for line in lines[at + 1 :] if line.startswith("Rss:"))
    return int(rss.split()[1]) * 1024 // mmap.PAGESIZE


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="residency is read from Linux's /proc/self/smaps")
def test_a_released_slice_leaves_ram_page_by_page_and_keeps_its_values(tmp_path):
    """A gradient's slice of a scratch vector: the whole pages inside it leave RAM, the pages it
    shares with its neighbours stay, and every value is still there."""
    import mmap

    per = mmap.PAGESIZE // 4  # float32 values per page
    with ScratchSpace(tmp_path) as space:
        a = space.array(8 * per)
        a[:] = np.arange(a.size, dtype=np.float32)
        other = a.copy()
        assert _resident_pages(a) == 8
        space.release(a[per // 2 : 5 * per + 3])  # pages 1..4 are inside it; 0 and 5 are shared
        assert _resident_pages(a) == 4
        space.release(a[7 * per + 1 :])  # the file's end, but its last page is shared with the value before
        assert _resident_pages(a) == 4
        space.release(a[6 * per :])  # pages 6 and 7, to the file's end
        assert _resident_pages(a) == 2
        space.release(np.arange(4, dtype=np.float32), other)  # not of this space: left alone
        assert _resident_pages(a) == 2
        assert np.array_equal(a, np.arange(a.size, dtype=np.float32))  # the values come back from the file
        assert _resident_pages(a) == 8
        space.release(a)
        assert _resident_pages(a) == 0


def test_tree_adds_in_pieces_give_the_same_bits(tmp_path, corpus, monkeypatch):
    """With scratch vectors the tree's adds run in pieces (``storage.ADD_PIECE``); pieces far smaller
    than a vector, and not dividing it, still give the in-memory run's files byte for byte."""
    from lockstep.train import storage

    monkeypatch.setattr(storage, "ADD_PIECE", 1000)
    _same_run_with_and_without_scratch(tmp_path, "tiny", "numba", True, 6, 2, 2, corpus)


def test_the_gradient_writer_takes_each_gradient_once_and_all_of_them():
    from lockstep.train.step import GradLayout

    be = get_backend("numba")
    layout = GradLayout(("a", "b"), ((2, 3), (4,)))
    out = np.full(layout.size, np.nan, dtype=np.float32)
    put, finish = layout.writer(out, be)
    put("b", np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match="came twice"):
        put("b", np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        put("a", np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="no gradient for a"):
        finish(np.float32(1.5))
    put("a", np.ones((2, 3), np.float32))
    finish(np.float32(1.5))
    assert out.tolist() == [1.5, 1, 1, 1, 1, 1, 1, 0, 1, 2, 3]
    with pytest.raises(ValueError, match="11 float32 elements"):
        layout.writer(np.zeros(10, np.float32), be)


def test_a_scratch_pool_takes_back_its_own_vectors_only(tmp_path):
    with ScratchSpace(tmp_path) as space:
        pool = VectorPool(7, scratch=space)
        v = pool.take()
        assert space.owns(v) and pool.allocated == 1
        pool.give(v, v[:3], np.ones(7, np.float32)[None, :][0])
        assert pool.take() is v and pool.take() is not v


def test_moment_files_keep_the_state_the_update_started_from(tmp_path):
    from lockstep.formats.state import AdamWState

    with ScratchSpace(tmp_path) as space:
        files = MomentFiles(space)
        start = files.adopt(AdamWState(4, {"w": np.ones((2, 3), np.float32)}, {"w": np.full((2, 3), 2, np.float32)}))
        place = files.place(5)
        new = place("m", "w", np.full((2, 3), 7, np.float32))
        assert new.shape == (2, 3) and (new == 7).all()
        assert (start.m["w"] == 1).all() and (start.v["w"] == 2).all()  # the other slot: untouched


def _same_run_with_and_without_scratch(tmp_path, name, backend, quantize, batch, micro, steps, corpus):
    cfg = preset(name, quantize=quantize)
    tcfg = train_preset(name, batch_ramp=((0, batch),), micro_batch=micro)
    common = dict(cfg=cfg, tcfg=tcfg, data=str(corpus), steps=steps, backend_name=backend, checkpoint_every=2,
                  **QUIET)
    train(tmp_path / "ram", **common)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    train(tmp_path / "disk", execution=Execution(scratch=str(scratch)), **common)
    want, got = _files(tmp_path / "ram"), _files(tmp_path / "disk")
    assert want.keys() == got.keys() and any(k.startswith("checkpoints") for k in want)
    assert all(want[k] == got[k] for k in want)
    assert os.listdir(scratch) == []  # the private folder went with the run
    return common


@pytest.mark.parametrize("quantize", [True, False])
def test_tiny_on_spec_and_numba_is_byte_identical_with_state_in_scratch(tmp_path, corpus, quantize):
    if quantize:  # the spec backend is slow: two steps of two micro-batches (both moment slots used)
        _same_run_with_and_without_scratch(tmp_path / "spec", "tiny", "spec", quantize, 4, 2, 2, corpus)
    _same_run_with_and_without_scratch(tmp_path / "numba", "tiny", "numba", quantize, 6, 2, 3, corpus)


@pytest.mark.parametrize("quantize", [True, False])
def test_small_on_numba_is_byte_identical_with_state_in_scratch(tmp_path, corpus, quantize):
    _same_run_with_and_without_scratch(tmp_path, "small", "numba", quantize, 2, 1, 2, corpus)


def test_tiny_on_opencl_is_byte_identical_with_state_in_scratch(tmp_path, corpus):
    _opencl_or_skip()
    for quantize in (True, False):
        _same_run_with_and_without_scratch(tmp_path / str(quantize), "tiny", "opencl", quantize, 6, 2, 2, corpus)


def test_a_resume_into_scratch_continues_the_same_trajectory(tmp_path, corpus):
    """A run resumed from its checkpoint with the state in a scratch folder (the moments adopted
    from the checkpoint) ends with the files of the run trained in memory."""
    _same_run_with_and_without_scratch(tmp_path, "tiny", "numba", True, 6, 2, 2, corpus)
    scratch = tmp_path / "scratch"
    for run, ex in (("ram", None), ("disk", Execution(scratch=str(scratch)))):
        train(tmp_path / run, resume=True, data=str(corpus), steps=4, backend_name="numba", execution=ex, **QUIET)
    want, got = _files(tmp_path / "ram"), _files(tmp_path / "disk")
    assert want.keys() == got.keys() and all(want[k] == got[k] for k in want)
    assert os.listdir(scratch) == []


def test_a_replay_with_its_state_in_scratch_matches_and_says_its_plan(honest_run, tmp_path):
    """A budget only the out-of-core plan fits: the replay says so in its plan line and still matches."""
    from lockstep.audit.replay import replay_steps
    from lockstep.formats.recipe import load_recipe, recipe_configs
    from lockstep.train.memory import GiB, step_memory

    cfg, tcfg = recipe_configs(load_recipe(honest_run))
    ram, disk = (step_memory(cfg, tcfg, Execution(scratch=s)).total for s in (None, str(tmp_path)))
    said = []
    result = replay_steps(honest_run, [3], "numba", max_memory=(ram + disk) / 2 / GiB, scratch=tmp_path,
                          log=said.append)
    assert result.checks and all(c.match for c in result.checks)
    assert any(line.startswith("memory plan to replay: moments and sums in") for line in said), said
    assert os.listdir(tmp_path) == []


def test_a_scratch_folder_that_is_a_link_is_refused_before_anything_is_written(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="symbolic link is refused"):
        train(out, cfg=preset("tiny"), tcfg=train_preset("tiny"), steps=1, backend_name="spec", scratch=link, **QUIET)
    assert not out.exists()
