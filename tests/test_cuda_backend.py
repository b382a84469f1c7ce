"""The cuda backend: one-line refusal without CuPy or a GPU; the runtime's bookkeeping on a stand-in
CuPy (no GPU needed); and, where a GPU is present, conformance and a training step against the spec.

GPU tests skip with the backend's own one-line reason (``BackendUnavailable``).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from backend_cases import check_conformance, cli_state_roots, reference_run

from lockstep.backends import BackendUnavailable, get_backend

ROOT = Path(__file__).resolve().parents[1]


def _has_cupy() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- refusal, one line

@pytest.mark.skipif(_has_cupy(), reason="CuPy is installed here")
@pytest.mark.parametrize("name", ["cupy", "cuda"])
def test_without_cupy_get_backend_is_one_clear_line(name):
    with pytest.raises(BackendUnavailable) as e:
        get_backend(name)
    msg = str(e.value)
    assert "\n" not in msg and "CuPy" in msg and "pip install 'lockstep[cuda]'" in msg


def _fake_cupy_without_gpu():
    def no_device():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    cp = types.ModuleType("cupy")
    cp.__version__ = "0-fake"
    cp.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_device))
    return cp


def test_without_a_gpu_get_backend_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy_without_gpu())
    with pytest.raises(BackendUnavailable) as e:
        get_backend("cuda")
    msg = str(e.value)
    assert "\n" not in msg and "no CUDA GPU" in msg and "cudaErrorNoDevice" in msg


@pytest.mark.skipif(_has_cupy(), reason="CuPy is installed here")
def test_cli_refuses_with_one_line_and_exit_1():
    res = subprocess.run([sys.executable, "-m", "lockstep.cli", "conformance", "--backend", "cupy"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "Traceback" not in res.stderr


# ---------------------------------------------------------------- the runtime on a stand-in CuPy

class _FakePointer:
    """A device pointer into host bytes: what CupyRuntime uses of cupy.cuda.MemoryPointer."""

    def __init__(self, mem: bytearray, offset: int = 0):
        self.mem, self.offset = mem, offset

    def __add__(self, n: int) -> "_FakePointer":
        return _FakePointer(self.mem, self.offset + int(n))

    def _view(self, n: int):
        return (ctypes.c_char * n).from_buffer(self.mem, self.offset)

    def copy_from_host(self, ptr: int, n: int) -> None:
        ctypes.memmove(self._view(n), ptr, n)

    def copy_to_host(self, ptr: int, n: int) -> None:
        ctypes.memmove(ptr, self._view(n), n)


class _FakeDevice:
    compute_capability = "90"

    def __init__(self, i=0):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fake_cupy(launches: list):
    class Module:
        def __init__(self, path):
            assert Path(path).read_bytes()[:4] == b"\x7fELF"  # the NVRTC cubin, never source code
            self.path = path

        def get_function(self, name):
            return lambda grid, block, args: launches.append((name, grid, block, args))

    cp = types.ModuleType("cupy")
    cp.__version__ = "0-fake"
    cp.RawModule = Module
    cp.cuda = types.SimpleNamespace(
        alloc=lambda n: _FakePointer(bytearray(n)), Device=_FakeDevice,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 13000,
                                      getDeviceProperties=lambda i: {"name": b"Fake GPU", "multiProcessorCount": 4}))
    return cp


@pytest.fixture(scope="module")
def cuda_cache(tmp_path_factory):
    """One kernel cache for this module's stand-in runtimes: NVRTC compiles the kernels once."""
    return tmp_path_factory.mktemp("cuda-cache")


@pytest.fixture
def fake_runtime(cuda_cache, monkeypatch):
    pytest.importorskip("lockstep.backends.kernels.backend", reason="the shared kernels are not in this build")
    from lockstep.backends.cupy_cuda import nvrtc
    from lockstep.backends.cupy_cuda.runtime import CupyRuntime

    try:
        nvrtc.load_nvrtc()
    except nvrtc.NVRTCUnavailable as e:
        pytest.skip(str(e))
    monkeypatch.setenv("LOCKSTEP_CUDA_CACHE", str(cuda_cache))
    launches: list = []
    return CupyRuntime(_fake_cupy(launches), 0), launches


def test_runtime_compiles_every_kernel_and_moves_bytes_exactly(fake_runtime):
    rt, _ = fake_runtime
    assert "sm_90" in rt.description and rt.built.cubin_path.exists()
    host = np.arange(10, dtype=np.int32) * 7 - 20
    buf = rt.upload(host)
    assert np.array_equal(rt.download(buf, np.int32, 10), host)
    assert np.array_equal(rt.download(buf, np.int32, 4, offset=3), host[3:7])


def test_runtime_launch_passes_buffers_scalars_and_param_blocks_by_value(fake_runtime):
    from lockstep.backends.kernels.layout import DeviceArray, c_strides
    from lockstep.backends.kernels.runtime import ParamBlock

    rt, launches = fake_runtime
    buf = rt.upload(np.zeros(8, np.float32))
    arr = DeviceArray(rt, buf, (2, 4), np.dtype(np.float32), c_strides((2, 4)), 0)
    params = ParamBlock("ls_copy_params", n=8, ndim=2, src_off=0, dst_off=0, shape=[2, 4, 1, 1, 1, 1],
                        src_stride=[4, 1, 0, 0, 0, 0], dst_stride=[4, 1, 0, 0, 0, 0])
    rt.launch("ls_copy32_kernel", (3,), (256,), (arr, params, np.int32(8)))
    name, grid, block, args = launches[-1]
    assert (name, grid, block) == ("ls_copy32_kernel", (3, 1, 1), (256, 1, 1))
    assert args[0] is buf and args[2] == np.int32(8) and type(args[2]) is np.int32
    assert isinstance(args[1], np.ndarray) and args[1].size == 1 and args[1].tobytes() == params.tobytes()
    assert args[1].nbytes == 4 * (4 + 3 * 6)  # the struct's size: 22 four-byte fields, passed by value
    with pytest.raises(TypeError):
        rt.launch("ls_canon_kernel", (1,), (1,), (3.5,))  # a bare Python float has no fixed width


def test_self_test_refuses_a_device_that_does_not_compute_the_specs_bits(fake_runtime, monkeypatch):
    """The stand-in's kernels do nothing (outputs stay zero): the first case, V1, must refuse the backend."""
    from lockstep.backends.kernels import backend

    rt, _ = fake_runtime
    monkeypatch.setitem(sys.modules, "cupy", rt.cp)
    monkeypatch.setattr(backend, "_RUNTIMES", {})
    with pytest.raises(BackendUnavailable) as e:
        get_backend("cuda")
    msg = str(e.value)
    assert "\n" not in msg and "self-test failed on V1" in msg and "spec 0x00800000, GPU 0x00000000" in msg


def test_elementwise_groups_cover_small_and_cap_large(fake_runtime):
    rt, _ = fake_runtime
    assert rt.elementwise_groups(1, 256) == 1
    assert rt.elementwise_groups(1000, 256) == 4
    assert rt.elementwise_groups(10**9, 256) == rt.sm_count * 32


# ---------------------------------------------------------------- on a GPU

@pytest.fixture(scope="module")
def cuda_backend():
    try:
        return get_backend("cuda")
    except BackendUnavailable as e:
        pytest.skip(str(e))


def test_gpu_conformance_level_1(cuda_backend):
    check_conformance(cuda_backend, level=1)


def test_gpu_tiny_training_steps_give_the_spec_state_roots(cuda_backend, tmp_path):
    from lockstep.spec import SPEC_VERSION

    run, version = reference_run("tiny-int8")
    if version != SPEC_VERSION:
        pytest.skip(f"reference roots are for SPEC_VERSION {version}: python3 benchmarks/device_check.py make-reference")
    assert cli_state_roots(run, "cuda", tmp_path / "run") == run["state_roots"]


# ---------------------------------------------------------------- the committed reference roots

def test_committed_reference_roots_are_the_specs(tmp_path):
    """benchmarks/data/device_check_reference.json (what a GPU's training steps are checked against)
    holds the spec's state roots: retrain tiny (int8) with the spec itself and compare."""
    run, _ = reference_run("tiny-int8")
    assert cli_state_roots(run, "spec", tmp_path / "run") == run["state_roots"], \
        "stale reference: regenerate with python3 benchmarks/device_check.py make-reference"
