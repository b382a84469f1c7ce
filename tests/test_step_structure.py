"""The step's structure: the memory model asks the backend, the step is observed (not rebuilt)
through ``StepWatch``, the update's regime and the vectors' pool are chosen once, the trainer
takes one ``RunSettings``, and the library names settings in its own terms."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lockstep.backends import (KERNELS_MEMORY, NUMBA_MEMORY, SPEC_MEMORY, Backend, declared_memory, get_backend)
from lockstep.cli.common import flag_of, said
from lockstep.errors import LockstepError, Setting, parts_of
from lockstep.formats.config import ConfigError, preset, train_preset
from lockstep.formats.schedule import plan_step
from lockstep.formats.state import AdamWState
from lockstep.formats.stream import GlobalStream
from lockstep.train import trainer
from lockstep.train.memory import choose_execution, step_memory
from lockstep.train.model import init_params
from lockstep.train.step import StepWatch, step_over_ranks
from lockstep.train.storage import (DeviceStorage, DeviceVectorPool, HostStorage, VectorPool, _DeviceUpdate,
                                    _FileUpdate, _HostUpdate, step_storage)


def test_each_backend_declares_its_memory_and_the_name_table_agrees():
    assert get_backend("spec").memory is SPEC_MEMORY is declared_memory("spec")
    assert declared_memory("numba") is NUMBA_MEMORY and declared_memory("auto") is NUMBA_MEMORY
    for name in ("opencl", "cuda", "cupy", "metal"):
        assert declared_memory(name) is KERNELS_MEMORY
    with pytest.raises(ValueError, match="unknown backend 'nonesuch'"):
        declared_memory("nonesuch")
    from lockstep.backends.kernels.attention import AttentionOps

    assert KERNELS_MEMORY.score_budget == AttentionOps.score_budget_bytes  # the kernels' own budget


def test_the_memory_model_reads_the_profile_not_a_name():
    cfg, tcfg = preset("tiny"), train_preset("tiny")
    spec_like = Backend("renamed", get_backend("spec").ops)  # a name the old rule counted as "kernels"
    assert step_memory(cfg, tcfg, memory=spec_like.memory).total == step_memory(cfg, tcfg, memory=SPEC_MEMORY).total
    resident = dataclasses.replace(SPEC_MEMORY, device_resident=True)
    host, dev = step_memory(cfg, tcfg, memory=SPEC_MEMORY), step_memory(cfg, tcfg, memory=resident)
    assert dev.terms["weights"] == 2 * host.terms["weights"]  # the device copy of the weights
    bigger = dataclasses.replace(SPEC_MEMORY, baseline=SPEC_MEMORY.baseline + 2**30)
    assert step_memory(cfg, tcfg, memory=bigger).total > host.total
    with pytest.raises(TypeError, match="MemoryProfile"):
        step_memory(cfg, tcfg, memory="kernels")
    plan = choose_execution(cfg, tcfg, "train it", memory=bigger, max_memory=1024)
    assert plan.need == step_memory(cfg, tcfg, plan.execution, bigger).total


class _Phases(StepWatch):
    def __init__(self):
        self.seen = []

    def micro_batch(self, j):
        self.seen.append(("mb", j))

    def tree(self):
        self.seen.append(("tree",))

    def update(self, summed, opt):
        self.seen.append(("update", summed.shape, opt.step))


def test_a_watched_step_is_the_same_step_and_sees_every_phase_in_order(tmp_path):
    be = get_backend("spec")
    cfg = preset("tiny")
    tcfg = train_preset("tiny", batch_ramp=((0, 6),), micro_batch=2)
    from lockstep.formats.corpus import default_corpus

    stream = GlobalStream(default_corpus(tmp_path / "data"), 7, cfg.seq_len)
    plan = plan_step(tcfg, cfg.seq_len, 1)
    windows = stream.windows(plan.first_window, plan.n_windows)
    params = init_params(cfg, 7, be)
    opt = AdamWState.zeros(params)
    plain = step_over_ranks(params, opt, windows, plan, cfg, tcfg, be)
    watch = _Phases()
    watched = step_over_ranks(params, opt, windows, plan, cfg, tcfg, be, watch=watch)
    assert watched.state_root == plain.state_root and watched.loss.tobytes() == plain.loss.tobytes()
    m = len(plan.micro_batches(tcfg.micro_batch))
    assert m == 3
    want = [x for j in range(m) for x in (("mb", j), ("tree",))]
    assert watch.seen[:-1] == want and watch.seen[-1][0] == "update" and watch.seen[-1][2] == 0


def test_one_storage_is_chosen_from_the_backend_and_the_plan_and_gives_pool_moments_and_regime(tmp_path):
    spec = get_backend("spec")
    host = step_storage(spec, 8)
    assert type(host) is HostStorage and type(host.pool) is VectorPool and host.host_pool is host.pool
    assert not host.pool.piecewise and host.moments is None and type(host.update(1)) is _HostUpdate

    class _Vectors:
        def empty(self, n):
            return np.empty(n, np.float32)

        def copy_into(self, dst, src):
            dst[...] = src

    from lockstep.contract.capabilities import Capabilities

    device = Backend("dev", spec.ops, capabilities=Capabilities(device_vectors=_Vectors()))
    for scratch in (None, str(tmp_path)):  # a device keeps its state: a scratch folder plays no part
        dev = step_storage(device, 8, scratch)
        assert type(dev) is DeviceStorage and isinstance(dev.pool, DeviceVectorPool)
        assert type(dev.host_pool) is VectorPool and dev.moments is None and type(dev.update(1)) is _DeviceUpdate
        dev.close()
    assert list(tmp_path.iterdir()) == []
    with step_storage(spec, 8, str(tmp_path)) as files:  # a host backend's state out of core: files
        assert files.pool.piecewise and files.space.owns(files.pool.take()) and files.host_pool is files.pool
        assert type(files.update(1)) is _FileUpdate
        params = {"w": np.ones(3, np.float32)}
        _, opt = files.adopt(params, AdamWState.zeros(params))
        assert all(files.space._owner(x) is not None for x in (*opt.m.values(), *opt.v.values()))
        private = list(tmp_path.iterdir())
        assert len(private) == 1
    assert list(tmp_path.iterdir()) == [], "closing the storage removes its private folder"


def test_a_device_resident_plan_offers_no_scratch_folder():
    cfg, tcfg = preset("tiny"), train_preset("tiny")
    plan = choose_execution(cfg, tcfg, "train it", memory=KERNELS_MEMORY, scratch="/tmp", max_memory=1024)
    assert plan.execution.scratch is None
    from lockstep.train.execution import Execution

    assert (step_memory(cfg, tcfg, Execution(scratch="/tmp"), KERNELS_MEMORY).total
            == step_memory(cfg, tcfg, Execution(), KERNELS_MEMORY).total)


def test_train_takes_one_settings_object_or_its_fields_not_both(tmp_path):
    cfg, tcfg = preset("tiny"), train_preset("tiny")
    with pytest.raises(TypeError, match="not both"):
        trainer.train(tmp_path / "r", trainer.RunSettings(cfg=cfg, tcfg=tcfg), steps=1, progress=False)
    with pytest.raises(TypeError):
        trainer.train(tmp_path / "r", stpes=1, progress=False)  # a misspelt setting is refused
    with pytest.raises(ConfigError) as caught:
        trainer.train(tmp_path / "r", trainer.RunSettings(cfg=cfg, tcfg=tcfg, steps=0), progress=False,
                      log=lambda *a: None)
    assert str(caught.value) == "steps must be a positive integer, got 0"  # the library's own terms
    assert caught.value.settings == ("steps",) and said(caught.value) == "--steps must be a positive integer, got 0"
    assert not (tmp_path / "r").exists()


def test_an_error_names_settings_by_keyword_and_a_front_end_words_them():
    err = ConfigError.naming("give ", Setting("max_memory"), " or ", Setting("run_dir"))
    assert str(err) == "give max_memory or run_dir" and err.settings == ("max_memory", "run_dir")
    assert err.worded(flag_of) == "give --max-memory or --out"
    plain = LockstepError("nothing named")
    assert plain.settings == () and said(plain) == "nothing named"
    wrapped = LockstepError.like(err)
    assert wrapped.parts == err.parts and said(wrapped) == "give --max-memory or --out"
    prefixed = LockstepError.naming("refused: ", *parts_of(err))  # a layer adds its words and keeps the settings
    assert prefixed.settings == err.settings and said(prefixed) == "refused: give --max-memory or --out"
    assert parts_of(plain) == ("nothing named",) and parts_of(ValueError("x")) == ("x",)
    assert said(ValueError("x")) == "x"


def test_a_new_run_over_an_old_one_names_the_settings_and_the_cli_its_flags(tmp_path):
    (tmp_path / "recipe.json").write_text("{}")
    with pytest.raises(FileExistsError) as caught:
        trainer.train(tmp_path, cfg=preset("tiny"), tcfg=train_preset("tiny"), steps=1, progress=False,
                      log=lambda *a: None)
    assert isinstance(caught.value, trainer.RunExists) and caught.value.settings == ("resume", "run_dir")
    assert str(caught.value).endswith("use resume to continue it or pick another run_dir")
    assert said(caught.value).endswith("use --resume to continue it or pick another --out")
