"""The spec gives identical bytes whatever SIMD paths NumPy takes.

Runs the same spec computation in subprocesses with NumPy's AVX2/AVX-512 dispatch
switched off (``NPY_DISABLE_CPU_FEATURES``) and compares digests. ``np.exp`` on
float32 itself is shown to differ under the switch on machines with AVX2 (it does
on this kind of machine: about a third of outputs), so the test can detect what it
is looking for; the spec must not differ.
"""

import json
import os
import platform
import subprocess
import sys

import pytest

SCRIPT = r"""
import hashlib, json, numpy as np
from lockstep import spec
from lockstep.conformance.golden import compute_golden
from lockstep.formats.config import preset
from lockstep.train.model import init_params, loss_and_grads
from lockstep.backends import get_backend
x = np.linspace(-80, 80, 200001, dtype=np.float32)
out = {
  "np_exp": hashlib.sha256(np.exp(x).tobytes()).hexdigest(),
  "spec_exp": hashlib.sha256(spec.exp(x).tobytes()).hexdigest(),
  "spec_log": hashlib.sha256(spec.log(np.abs(x) + np.float32(1e-3)).tobytes()).hexdigest(),
  "golden": hashlib.sha256(json.dumps(sorted((k[0], k[1], v) for k, v in compute_golden().items())).encode()).hexdigest(),
}
cfg = preset("tiny")
p = init_params(cfg, 1)
w = (np.arange(4 * 33).reshape(4, 33) * 7) % 257
loss, g = loss_and_grads(p, w, cfg, get_backend("spec"))
h = hashlib.sha256(np.asarray(loss).tobytes())
for k in sorted(g): h.update(g[k].tobytes())
out["tiny_step"] = h.hexdigest()
print(json.dumps(out))
"""

DISABLE = "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"


def _run(env_extra):
    env = dict(os.environ, **env_extra)
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="NumPy's X86_* dispatch switches exist on x86-64 only")
def test_spec_bytes_do_not_depend_on_simd_level():
    base = _run({})
    try:
        low = _run({"NPY_DISABLE_CPU_FEATURES": DISABLE})
    except AssertionError as e:
        if "NPY_DISABLE_CPU_FEATURES" in str(e) or "baseline" in str(e):
            pytest.skip(f"this NumPy cannot disable {DISABLE}: {e}")
        raise
    for key in ("spec_exp", "spec_log", "golden", "tiny_step"):
        assert base[key] == low[key], key
    from numpy._core._multiarray_umath import __cpu_features__

    if __cpu_features__.get("AVX2"):
        # evidence that the switch took effect: libm-style np.exp changes its bits
        assert base["np_exp"] != low["np_exp"]
