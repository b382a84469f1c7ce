"""The metal backend: its one-line refusals, its compile options and launch bookkeeping, and on a Mac the real thing.

Nothing here runs Metal off a Mac. What CI checks: ``get_backend("metal")`` fails with one clear
line off macOS, without PyObjC and without a device; the compile options turn fast math off on
both OS generations; and the runtime's Python side binds kernel argument i to buffer slot i and
commits/waits/reports command buffers as it should, which is checked by recording the calls it
makes on stand-in objects (they record, they compute nothing). Whether Apple's compiler accepts
the kernels and the GPU computes the spec's bits is only known from a Mac: the tests at the end
run there (conformance, training steps, the flush probe) and skip elsewhere with the backend's
own reason; ``tools/validate_metal.sh`` runs the same checks and writes a report.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from backend_cases import check_conformance

from lockstep.backends import BackendUnavailable, get_backend
from lockstep.backends.kernels.layout import DeviceArray
from lockstep.backends.kernels.runtime import ParamBlock
from lockstep.backends.metal import runtime as metal_runtime

ROOT = Path(__file__).resolve().parents[1]


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# ---------------------------------------------------------------- refusals, one line each

@pytest.mark.skipif(sys.platform == "darwin", reason="this is macOS")
def test_off_macos_get_backend_is_one_clear_line():
    with pytest.raises(BackendUnavailable) as e:
        get_backend("metal")
    msg = _one_line(e)
    assert "needs macOS" in msg and "(this is " in msg and "--backend numba" in msg


def test_on_macos_without_pyobjc_it_says_what_to_install(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setitem(sys.modules, "Metal", None)  # import Metal -> ImportError
    with pytest.raises(BackendUnavailable) as e:
        get_backend("metal")
    assert "pip install 'lockstep[metal]'" in _one_line(e)


def test_without_a_metal_device_it_says_so(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setitem(sys.modules, "Metal", types.SimpleNamespace(MTLCreateSystemDefaultDevice=lambda: None))
    with pytest.raises(BackendUnavailable) as e:
        get_backend("metal")
    assert "no Metal device" in _one_line(e)


@pytest.mark.skipif(sys.platform == "darwin", reason="this is macOS")
def test_the_validation_script_refuses_off_macos_and_installs_nothing():
    res = subprocess.run(["bash", str(ROOT / "tools" / "validate_metal.sh"), "never-written.md"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "needs macOS" in res.stderr, res.stderr
    assert not (ROOT / "never-written.md").exists()
    script = (ROOT / "tools" / "validate_metal.sh").read_text().splitlines()
    advice = [line for line in script if "pip install" in line and not line.lstrip().startswith("#")]
    assert advice and all('fail "' in line for line in advice)  # pip appears only in advice, never run


# ---------------------------------------------------------------- compile options

class _Options:
    """Stand-in for MTLCompileOptions: records the setters called."""

    def __init__(self, math_mode: bool):
        self.calls = []
        if math_mode:
            self.setMathMode_ = lambda v: self.calls.append(("mathMode", v))
            self.setMathFloatingPointFunctions_ = lambda v: self.calls.append(("mathFloatingPointFunctions", v))

    def setFastMathEnabled_(self, v):
        self.calls.append(("fastMathEnabled", v))

    def setLanguageVersion_(self, v):
        self.calls.append(("languageVersion", v))


def _metal_with_options(opts) -> types.SimpleNamespace:
    factory = types.SimpleNamespace(alloc=lambda: types.SimpleNamespace(init=lambda: opts))
    return types.SimpleNamespace(MTLCompileOptions=factory)


def test_compile_options_turn_fast_math_off_on_every_macos():
    new = _Options(math_mode=True)  # macOS 15+: mathMode safe, precise functions
    _, words = metal_runtime.compile_options(_metal_with_options(new))
    assert new.calls == [("mathMode", 0), ("mathFloatingPointFunctions", 1), ("languageVersion", (2 << 16) | 4)]
    assert words == ["mathMode=safe", "mathFloatingPointFunctions=precise", "languageVersion=2.4"]
    old = _Options(math_mode=False)  # before macOS 15: fastMathEnabled defaults to YES
    _, words = metal_runtime.compile_options(_metal_with_options(old))
    assert old.calls == [("fastMathEnabled", False), ("languageVersion", (2 << 16) | 4)]
    assert words[0] == "fastMathEnabled=NO"


def test_the_source_metal_compiles_has_the_pragma_and_the_fixup():
    from lockstep.backends import kernels

    src = kernels.source("metal")
    assert src.index("#pragma STDC FP_CONTRACT OFF") < src.index('#line 1 "ls_fp.h"')
    assert "return ls_mul_tiny_fixup(a, b, ls_mul_hw(a, b));" in src
    assert "return ls_div_tiny_fixup(a, b, ls_div_hw(a, b));" in src


# ---------------------------------------------------------------- launch bookkeeping (recorded, not run)

class _Recorder:
    """Records every Objective-C call made on it (by selector name) and returns what it is told to."""

    def __init__(self, log, name, returns=None):
        self._log, self._name, self._returns = log, name, returns or {}

    def __getattr__(self, selector):
        def call(*args):
            self._log.append((self._name, selector, args))
            return self._returns.get(selector)
        return call


def _recording_runtime(max_threads=1024, status=4):
    log = []
    encoder = _Recorder(log, "encoder")
    command_buffer = _Recorder(log, "command_buffer", {"computeCommandEncoder": encoder, "status": status, "error": "boom"})
    rt = object.__new__(metal_runtime.MetalRuntime)
    rt.mtl = types.SimpleNamespace(MTLSize=lambda *xyz: ("size", *xyz))
    rt.device_name = "stand-in"
    rt.queue = _Recorder(log, "queue", {"commandBuffer": command_buffer})
    rt.pipelines = {"ls_add_kernel": _Recorder(log, "pipeline", {"maxTotalThreadsPerThreadgroup": max_threads})}
    rt._command_buffer = rt._encoder = None
    rt._dispatches, rt._in_flight = 0, []
    return rt, log


def test_launch_binds_argument_i_to_slot_i_and_dispatches_threadgroups():
    rt, log = _recording_runtime()
    out = DeviceArray(rt, "buffer-out", (8,), np.dtype(np.float32), (1,), 0)
    a = DeviceArray(rt, "buffer-a", (8,), np.dtype(np.float32), (1,), 3)  # a view: its offset travels as an int
    params = ParamBlock("ls_quantize_params", rows=1, cols=2, x_off=3, x_rs=4, x_cs=5, s_row=6, s_col=7)
    rt.launch("ls_add_kernel", (5,), (256,), [out, a, np.int32(8), np.float32(0.5), params])
    encoder_calls = [(sel, args) for who, sel, args in log if who == "encoder"]
    assert encoder_calls == [
        ("setComputePipelineState_", (rt.pipelines["ls_add_kernel"],)),
        ("setBuffer_offset_atIndex_", ("buffer-out", 0, 0)),
        ("setBuffer_offset_atIndex_", ("buffer-a", 0, 1)),
        ("setBytes_length_atIndex_", (np.int32(8).tobytes(), 4, 2)),
        ("setBytes_length_atIndex_", (np.float32(0.5).tobytes(), 4, 3)),
        ("setBytes_length_atIndex_", (params.tobytes(), 28, 4)),
        ("dispatchThreadgroups_threadsPerThreadgroup_", (("size", 5, 1, 1), ("size", 256, 1, 1))),
    ]
    assert not any(sel == "commit" for _, sel, _ in log)  # batched until a download or finish
    rt.finish()
    assert [sel for who, sel, _ in log if who == "command_buffer"][-4:] == ["computeCommandEncoder", "commit",
                                                                            "waitUntilCompleted", "status"]
    assert ("encoder", "endEncoding", ()) in log


def test_launch_refuses_threadgroups_the_pipeline_cannot_run_and_bad_arguments():
    rt, _ = _recording_runtime(max_threads=128)
    with pytest.raises(RuntimeError, match="needs threadgroups of 256 threads; stand-in allows 128"):
        rt.launch("ls_add_kernel", (1,), (16, 16), [])
    rt, _ = _recording_runtime()
    with pytest.raises(TypeError, match="argument 0"):
        rt.launch("ls_add_kernel", (1,), (1,), [3])
    with pytest.raises(KeyError, match="no Metal pipeline"):
        rt.launch("ls_nonexistent_kernel", (1,), (1,), [])


def test_a_failed_command_buffer_is_an_error_naming_the_device():
    rt, _ = _recording_runtime(status=metal_runtime.COMMAND_BUFFER_ERROR)
    rt.launch("ls_add_kernel", (1,), (1,), [np.int32(1)])
    with pytest.raises(RuntimeError, match="a Metal command buffer failed on stand-in: boom"):
        rt.finish()


def test_command_buffers_are_committed_in_batches():
    rt, log = _recording_runtime()
    for _ in range(metal_runtime.DISPATCHES_PER_COMMAND_BUFFER + 1):
        rt.launch("ls_add_kernel", (1,), (1,), [np.int32(1)])
    assert [sel for _, sel, _ in log].count("commit") == 1 and len(rt._in_flight) == 1
    rt.finish()
    assert [sel for _, sel, _ in log].count("commit") == 2 and rt._in_flight == []


# ---------------------------------------------------------------- on a Mac with a Metal GPU

@pytest.fixture(scope="module")
def metal():
    try:
        return get_backend("metal")
    except BackendUnavailable as e:
        pytest.skip(f"metal backend unavailable: {e}")


def test_metal_conformance_level_1(metal):
    check_conformance(metal, level=1)


def test_metal_flush_probe_ops_equal_the_spec(metal):
    from lockstep.conformance.flush_probe import probe

    result = probe(metal, n=10**5)
    assert result["ops_equal_spec"], result["verdict"]


def test_metal_tiny_training_steps_give_the_spec_state_roots(metal):
    from lockstep.conformance.report import training_section

    section = training_section("metal")
    assert section["passed"], section
