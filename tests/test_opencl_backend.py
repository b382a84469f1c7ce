"""The OpenCL backend (the shared GPU kernels, run on the CPU through PoCL in CI) against the spec.

Every op at conformance level 2, whole training steps to the spec's state root, train and
audit-replay across backends from the command line, device arrays, the binary cache, and the
one-line errors when PyOpenCL or a device is missing. Shapes are small: PoCL is the test bed,
not a fast device.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from backend_cases import (assert_same, check_conformance, check_implements_every_spec_op, check_int8_linear,
                           check_train_and_replay, check_training_steps, loaded_backend, random_values, same_bits)

from lockstep import spec
from lockstep.backends import BackendUnavailable, get_backend
from lockstep.backends.kernels.backend import ops_for
from lockstep.conformance import inputs as gen

_BE, pytestmark = loaded_backend("opencl")


@pytest.fixture(scope="module")
def be():
    return _BE


# ---------------------------------------------------------------- the op table and conformance

def test_backend_implements_every_spec_op(be):
    check_implements_every_spec_op(be, "opencl")
    assert "OpenCL on" in be.description


def test_conformance_level2_all_pass(be):
    results = check_conformance(be, level=2)
    assert all(r.golden == "match" for r in results)


# ---------------------------------------------------------------- whole training steps

@pytest.mark.parametrize("quantize", [True, False])
def test_tiny_training_steps_give_the_spec_state_root(be, quantize):
    check_training_steps(be, "tiny", quantize=quantize, to_host=True)


def test_train_on_opencl_and_replay_on_numba_and_the_other_way(tmp_path, capsys):
    """``lockstep train --preset tiny --backend opencl`` runs; each run replays to a match on the other backend."""
    pytest.importorskip("numba", reason="the cross-backend replay needs the numba backend")
    check_train_and_replay(tmp_path, capsys, (("opencl", "numba"), ("numba", "opencl")), "2")


# ---------------------------------------------------------------- paths the conformance cases rarely reach

def _values(seed, shape, lo_exp, hi_exp):
    return random_values("opencl-test", seed, shape, lo_exp, hi_exp)


@pytest.fixture(params=["score buffers", "row kernels"])
def attention_form(request, be, monkeypatch):
    """Each form of the kernels' attention: the score-buffer form (the default at these sizes) and the
    row kernels without a T x T buffer (a score budget of 0 bytes selects them)."""
    if request.param == "row kernels":
        monkeypatch.setattr(ops_for(be.capabilities.kernel_runtime), "score_budget_bytes", 0)
    return request.param


def test_attention_near_the_flush_range_with_windows_and_nonfinite_inputs(be, attention_form):
    b, h, g, t, dh = 1, 4, 2, 70, 3  # T > 64: queries and keys span two tiles
    for window in (2, 33, None):
        q = _values(window or 0, (b, h, t, dh), -3, 3)
        k = _values(100, (b, g, t, dh), -3, 3)
        v = _values(200, (b, g, t, dh), -66, -61)
        do = _values(300, (b, h, t, dh), -66, -61)
        fw = spec.attention_forward(q, k, v, window)
        assert_same(fw, be.attention_forward(q, k, v, window), f"fwd window {window}")
        assert_same(spec.attention_backward(do, q, k, v, *fw, window),
                    be.attention_backward(do, q, k, v, *fw, window), f"bwd window {window}")
    q, k, v = _values(7, (1, 2, 9, 3), -2, 2), _values(8, (1, 1, 9, 3), -2, 2), _values(9, (1, 1, 9, 3), -2, 2)
    v[0, 0, 8, 0] = np.inf  # masked for every query but the last: absent, so no 0 * inf
    v[0, 0, 0, 1] = np.nan
    fw = spec.attention_forward(q, k, v, 3)
    assert_same(fw, be.attention_forward(q, k, v, 3), "fwd non-finite")


def test_attention_row_kernels_past_their_local_cache_and_chunks(be, monkeypatch):
    """Rows longer than the forward's local score cache (1024 keys: the rest recomputed) and than a chunk
    of staged weights (128), with windows that cut inside a chunk; several heads per KV group. The long
    rows are checked against numba (equal to the spec: test_conformance), the spec being slow at T = 1030."""
    monkeypatch.setattr(ops_for(be.capabilities.kernel_runtime), "score_budget_bytes", 0)
    cases = [(spec, (2, 3, 1, 150, 5, 130)), (spec, (1, 2, 2, 40, 3, None))]
    try:
        cases.append((get_backend("numba"), (1, 2, 1, 1030, 2, 1029)))
    except BackendUnavailable:  # pragma: no cover - CI installs numba
        pass
    for ref, (b, h, g, t, dh, window) in cases:
        q, do = _values(t, (b, h, t, dh), -3, 3), _values(t + 1, (b, h, t, dh), -3, 3)
        k, v = _values(t + 2, (b, g, t, dh), -3, 3), _values(t + 3, (b, g, t, dh), -3, 3)
        fw = ref.attention_forward(q, k, v, window)
        assert_same(fw, be.attention_forward(q, k, v, window), f"fwd {t} window {window}")
        assert_same(ref.attention_backward(do, q, k, v, *fw, window),
                    be.attention_backward(do, q, k, v, *fw, window), f"bwd {t} window {window}")


def test_attention_holds_no_t_by_t_buffer_past_the_score_budget(be, monkeypatch):
    """Every buffer the kernels' attention allocates, logged at the runtime: with the score-buffer form the
    largest is the (B*H, T, T) scores; past the budget none reaches T*T floats of one head, and none is
    larger than the (B, H, T, Dh) outputs."""
    rt = be.capabilities.kernel_runtime
    ops = ops_for(rt)
    assert not ops._scores_fit(1, 16, 4096) and ops._scores_fit(4, 4, 256)  # the default: open-1b rows; small's micro-batch
    b, h, g, t, dh, window = 1, 2, 1, 256, 8, None
    q, do = _values(1, (b, h, t, dh), -3, 3), _values(2, (b, h, t, dh), -3, 3)
    k, v = _values(3, (b, g, t, dh), -3, 3), _values(4, (b, g, t, dh), -3, 3)
    q, do, k, v = (be.asarray(x) for x in (q, do, k, v))
    sizes = []
    real_alloc = rt.alloc

    def logged(nbytes):
        sizes.append(int(nbytes))
        return real_alloc(nbytes)

    monkeypatch.setattr(rt, "alloc", logged)
    results = {}
    for name, budget in (("scores", 2 * b * h * t * t * 4), ("rows", 2 * b * h * t * t * 4 - 1)):
        monkeypatch.setattr(ops, "score_budget_bytes", budget)
        sizes.clear()
        fw = be.attention_forward(q, k, v, window)
        bw = be.attention_backward(do, q, k, v, *fw, window)
        results[name] = (max(sizes), [be.to_numpy(x) for x in fw + bw])
    assert results["scores"][0] == b * h * t * t * 4  # the hook sees the T x T buffers when they exist
    assert results["rows"][0] < t * t * 4
    assert results["rows"][0] == b * h * t * dh * 4
    assert all(same_bits(x, y) for x, y in zip(results["scores"][1], results["rows"][1]))


@pytest.mark.parametrize("quantize", [True, False])
def test_tiny_training_steps_with_the_attention_row_kernels_give_the_spec_state_root(be, quantize, monkeypatch):
    monkeypatch.setattr(ops_for(be.capabilities.kernel_runtime), "score_budget_bytes", 0)
    check_training_steps(be, "tiny", quantize=quantize, to_host=True)


def test_matmul_views_tiles_and_broadcast_batches(be):
    a = _values(1, (70, 40), -3, 3)
    a[2] = _values(2, (40,), -70, -60)  # products in the flush range
    b = _values(3, (40, 130), -60, -50)
    assert_same(spec.matmul(a, b), be.matmul(a, b), "matmul 70x40x130")
    da, db = be.asarray(a), be.asarray(b)
    assert_same(spec.matmul(b.T, a.T), be.matmul(db.T, da.T), "matmul of transposed views")
    x = _values(4, (2, 3, 5, 40), -2, 2)
    assert_same(spec.matmul(x, b), be.matmul(x, b), "batched x 2-d")
    assert_same(spec.matmul(a[None, :5], x[0, :, :, :].transpose(0, 2, 1)[:, :, :4]),
                be.matmul(a[None, :5], be.asarray(x)[0].transpose(0, 2, 1)[:, :, :4]), "broadcast batch, sliced view")
    assert_same(spec.matmul(np.zeros((3, 0), np.float32), np.zeros((0, 2), np.float32)),
                be.matmul(np.zeros((3, 0), np.float32), np.zeros((0, 2), np.float32)), "K = 0")


@pytest.mark.parametrize("m,k,n", [(130, 24, 16), (8, 16, 70), (7, 12, 5)])
def test_int8_linear_odd_shapes(be, m, k, n):
    check_int8_linear(be, "ocl-i8", m, k, n)


def test_sum_of_squares_blocks_and_large_reductions(be):
    for n in (0, 1, 4096, 4097, 3 * 4096 + 5, 40000):
        g = _values(n, (n,), -70, 10)
        assert_same(spec.sum_of_squares(g), be.sum_of_squares(g), f"sum_of_squares n={n}")
    x = _values(5, (3, 70, 33), -20, 20)
    for axis in (0, 1, 2):
        assert_same(spec.lane_tree_sum(x, axis), be.lane_tree_sum(x, axis), f"lane_tree_sum axis {axis}")
        assert_same(spec.argmax(x, axis), be.argmax(x, axis), f"argmax axis {axis}")
    assert_same(spec.column_sum(x.transpose(1, 0, 2)[::2]), be.column_sum(be.asarray(x).transpose(1, 0, 2)[::2]),
                "column_sum of a view")


def test_device_arrays_move_data_like_numpy(be):
    x = gen.random_uniform(0, ("ocl-views",), (2, 3, 4, 5), -1, 1)
    d = be.asarray(x)
    for view, want in [(d.T, x.T), (d.transpose(0, 2, 1, 3), x.transpose(0, 2, 1, 3)), (d[..., 1:4], x[..., 1:4]),
                       (d[1, :, ::2], x[1, :, ::2]), (d[:, -1], x[:, -1]), (d.reshape(6, 20), x.reshape(6, 20)),
                       (d.transpose(3, 1, 0, 2).reshape(-1, 4), x.transpose(3, 1, 0, 2).reshape(-1, 4)),
                       (d[:, None, 0], x[:, None, 0]), (d[:, 2:2], x[:, 2:2])]:
        assert same_bits(want, be.to_numpy(view)), view
        assert same_bits(want, np.asarray(view))
    sub = np.array([0x00000001, 0x807FFFFF, 0x7FC12345, 0xFFC00000], np.uint32).view(np.float32)
    assert be.to_numpy(be.asarray(sub)).view(np.uint32).tolist() == [0, 0x80000000, 0x7FC00000, 0x7FC00000]
    ids = np.array([[3, 1], [2, 0]], dtype=np.int64)
    assert same_bits(ids, be.to_numpy(be.asarray(ids)))
    assert same_bits(np.int8([-128, 127]), be.to_numpy(be.asarray(np.int8([-128, 127]))))
    assert same_bits(spec.add(x, x), be.add(d.reshape(120), x.reshape(120)).reshape(x.shape))


# ---------------------------------------------------------------- build cache and errors

def _run(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_program_binary_is_cached_on_disk(tmp_path):
    code = "from lockstep.backends import get_backend; print(get_backend('opencl').description)"
    first = _run(code, {"LOCKSTEP_CACHE_DIR": str(tmp_path)})
    second = _run(code, {"LOCKSTEP_CACHE_DIR": str(tmp_path)})
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "built from source" in first.stdout and "binary from cache" in second.stdout
    assert len(list((tmp_path / "opencl").glob("*.bin"))) == 1


def test_missing_pyopencl_or_device_is_one_clear_line(tmp_path):
    blocked = ("import sys; sys.modules['pyopencl'] = None\n"
               "from lockstep.cli import main; sys.exit(main(['conformance', '--backend', 'opencl']))")
    r = _run(blocked, {})
    assert r.returncode == 1
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "PyOpenCL" in lines[0] and "pip install" in lines[0], lines
    assert "Traceback" not in r.stderr
    r = _run("from lockstep.cli import main; import sys; sys.exit(main(['conformance', '--backend', 'opencl']))",
             {"LOCKSTEP_OPENCL_DEVICE": "no-such-device"})
    assert r.returncode == 1
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "no OpenCL device matches" in lines[0], lines
    with pytest.raises(BackendUnavailable, match="PyOpenCL"):
        import builtins

        real_import = builtins.__import__

        def no_pyopencl(name, *args, **kwargs):
            if name == "pyopencl":
                raise ImportError("No module named 'pyopencl'")
            return real_import(name, *args, **kwargs)

        builtins.__import__ = no_pyopencl
        try:
            from lockstep.backends.opencl.runtime import open_runtime

            open_runtime()
        finally:
            builtins.__import__ = real_import


def test_device_choice_by_index_or_name(monkeypatch):
    from lockstep.backends.opencl.runtime import DEVICE_ENV, open_runtime

    default = open_runtime()
    monkeypatch.setenv(DEVICE_ENV, "0:0")
    by_index = open_runtime()
    monkeypatch.setenv(DEVICE_ENV, default.device_name[:6].upper())
    by_name = open_runtime()
    assert by_name.device_name == default.device_name
    assert by_index.device_name  # platform 0, device 0 exists
    monkeypatch.setenv(DEVICE_ENV, "9:9")
    with pytest.raises(BackendUnavailable, match=r"no OpenCL device matches .*available: 0:0 "):
        open_runtime()
