"""The sections of ``benchmarks/device_check.sh``: one GPU machine visit, every CUDA-backend question.

    python3 benchmarks/device_check.py SECTION --work DIR      (the shell script calls these)
    python3 benchmarks/device_check.py make-reference          (here, on a CPU: the committed roots)

Each section writes ``DIR/<section>.json`` and prints what it found; ``summary`` merges
them (with the shell's exit codes and times) into one JSON and prints the table. A
section never depends on another's success, except ``roots`` and ``replay``, which also use
the runs that the shell trains with numba in the background (``numba-reference``).

Sections: ``versions``, ``conformance`` (cupy, level 2), ``probe`` (flush probe), ``gemm_int8`` (cuBLAS gemmEx at Open-1B
layer shapes), ``roots`` (cupy training steps against the spec's state roots),
``replay`` (audit replay on cupy of a numba-trained run), ``numba-reference`` (the
background job: the reference runs trained with numba on the GPU machine's CPU), ``gemm_float`` (the fixed-order
float GEMM), ``torch`` (stock PyTorch float32/bf16 step), ``throughput`` (lockstep cupy
step: tokens/s and MFU), ``breakdown`` (the step's phases with the state on the device: kernels,
update, hashing, bytes moved; measured next to ``perf_model.py``'s prediction), ``open1b`` (one
Open-1B micro-batch with recompute and a chunked head, where those options exist), ``summary``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

REFERENCE_FILE = ROOT / "benchmarks" / "data" / "device_check_reference.json"
# The runs whose state roots the cupy backend must reproduce: (label, lockstep train arguments).
REFERENCE_RUNS = (
    ("tiny-int8", ["--preset", "tiny", "--steps", "2"]),
    ("tiny-float", ["--preset", "tiny", "--steps", "2", "--no-quantize"]),
    ("small-int8", ["--preset", "small", "--steps", "1"]),
)
# Open-1B linear layers at a micro-batch of 4 x 4096 tokens: (name, M, K, N) of y (M, N) = x (M, K) @ w (K, N).
OPEN1B_TOKENS = 4 * 4096
OPEN1B_GEMMS = (
    ("attn.wqkv fwd", OPEN1B_TOKENS, 2048, 3072),
    ("attn.wo fwd", OPEN1B_TOKENS, 2048, 2048),
    ("ffn.w_gate_up fwd", OPEN1B_TOKENS, 2048, 11264),
    ("ffn.w_down fwd", OPEN1B_TOKENS, 5632, 2048),
    ("ffn.w_down dw", 5632, OPEN1B_TOKENS, 2048),
)


def _partial(work: Path, section: str, data: dict) -> None:
    """Save what a section has measured so far (read if the section runs out of time)."""
    (work / f"{section}.partial.json").write_text(json.dumps(data, indent=2, default=str) + "\n")


def _write(work: Path, section: str, data: dict) -> None:
    (work / f"{section}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(json.dumps(data, default=str)[:4000])


def _run_lockstep(args: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lockstep.cli", *args]
    print("$ " + " ".join(cmd), flush=True)
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    sys.stdout.write(res.stdout[-3000:])
    sys.stdout.write(res.stderr[-3000:])
    return res


def _trajectory_roots(run_dir: Path) -> list[str]:
    lines = (run_dir / "trajectory.jsonl").read_text().splitlines()
    return [json.loads(x)["state_root"] for x in lines]


def _cuda_timer(cp):
    """A function that times ``fn()`` on the GPU: median milliseconds over ``reps`` after ``warm`` calls."""
    def timed(fn, reps: int = 10, warm: int = 2) -> float:
        for _ in range(warm):
            fn()
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(reps):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        return statistics.median(times)
    return timed


# ---------------------------------------------------------------- versions

def section_versions(work: Path) -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine()}
    from lockstep.spec import SPEC_VERSION

    out["SPEC_VERSION"] = SPEC_VERSION
    for mod in ("numba", "torch", "cupy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - report, do not stop
            out[mod] = f"unavailable: {type(e).__name__}: {e}"
    try:
        import cupy as cp

        out["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
        out["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
        props = cp.cuda.runtime.getDeviceProperties(0)
        out["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        out["compute_capability"] = cp.cuda.Device(0).compute_capability
        out["sm_count"] = props["multiProcessorCount"]
        out["gpu_memory_gib"] = round(props["totalGlobalMem"] / 2**30, 1)
    except Exception as e:  # noqa: BLE001
        out["cuda"] = f"unavailable: {type(e).__name__}: {e}"
    try:
        from lockstep.backends.cupy_cuda.nvrtc import load_nvrtc

        major = out.get("cuda_runtime", 0) // 1000 if isinstance(out.get("cuda_runtime"), int) else None
        c = load_nvrtc(prefer_major=major)
        out["nvrtc"] = {"version": list(c.version), "driver": c.driver, "path": c.path}
    except Exception as e:  # noqa: BLE001
        out["nvrtc"] = f"unavailable: {type(e).__name__}: {e}"
    t0 = time.perf_counter()
    try:  # compile (or load from the cache), lint, load and self-test the kernels
        from lockstep.backends import get_backend

        be = get_backend("cuda")
        out["backend"] = be.description
        out["kernel_cache"] = be.info.get("kernel_cache")
    except Exception as e:  # noqa: BLE001
        out["backend"] = f"unavailable: {type(e).__name__}: {e}"
    out["backend_seconds"] = round(time.perf_counter() - t0, 2)
    print(f"backend: {out['backend']} ({out['backend_seconds']} s)", flush=True)
    return out


# ---------------------------------------------------------------- flush probe

def section_probe(work: Path) -> dict:
    import cuda_flush_probe

    res = cuda_flush_probe.probe(int(os.environ.get("PROBE_N", 10_000_000)), seed=0)
    res["verdict"] = cuda_flush_probe.verdict(res)
    print(res["verdict"])
    return res


# ---------------------------------------------------------------- conformance

def section_conformance(work: Path) -> dict:
    """``lockstep conformance --backend cupy --level 2``; the full table goes to conformance.txt."""
    res = _run_lockstep(["conformance", "--backend", "cupy", "--level", "2"])
    (work / "conformance.txt").write_text(res.stdout + res.stderr)
    lines = [x for x in res.stdout.splitlines() if " passed, " in x]
    failing = [x.split()[0] for x in res.stdout.splitlines() if x.rstrip().endswith(("FAIL", "ERROR", "MISSING"))]
    return {"returncode": res.returncode, "summary": lines[-1] if lines else (res.stderr.strip().splitlines() or ["?"])[-1],
            "not_passing": failing}


# ---------------------------------------------------------------- int8 GEMM

def _torch_timer():
    """Like ``_cuda_timer`` but with PyTorch's events on PyTorch's current stream."""
    import torch

    def timed(fn, reps: int = 10, warm: int = 2) -> float:
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    return timed


def _torch_bf16_ms(m: int, k: int, n: int) -> dict:
    """The same GEMM shape in PyTorch bf16 (tensor cores) and ``torch._int_mm``: context for the int8 numbers."""
    try:
        import torch

        ta = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        tb = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ms = _torch_timer()(lambda ta=ta, tb=tb: ta @ tb)
        out = {"torch_bf16_ms": ms, "torch_bf16_tflops": 2.0 * m * k * n / ms / 1e9}
        del ta, tb
        ia = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
        ib = torch.randint(-127, 128, (k, n), device="cuda", dtype=torch.int8)
        ms = _torch_timer()(lambda: torch._int_mm(ia, ib))  # PyTorch's own int8 GEMM (cuBLASLt)
        out.update(torch_int_mm_ms=ms, torch_int_mm_tops=2.0 * m * k * n / ms / 1e9)
        return out
    except Exception as e:  # noqa: BLE001 - context only
        return {"torch_bf16": f"unavailable: {type(e).__name__}: {e}"}


def section_gemm_int8(work: Path) -> dict:
    import cupy as cp

    from lockstep.backends.cupy_cuda.cublas_int8 import Int8Gemm

    gemm = Int8Gemm(cp)
    timed = _cuda_timer(cp)
    cp.random.seed(0)  # benchmark inputs only; nothing published
    rows = []
    for name, m, k, n in OPEN1B_GEMMS:
        a = cp.random.randint(-127, 128, size=(m, k), dtype=cp.int32).astype(cp.int8)
        b = cp.random.randint(-127, 128, size=(k, n), dtype=cp.int32).astype(cp.int8)
        c = gemm(a, b)
        # exact on the host: float64 holds every partial sum (|sum| <= K * 127**2 < 2**53)
        want = cp.asnumpy(a[:8]).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
        exact = bool(np.array_equal(cp.asnumpy(c[:8]).astype(np.float64), want))
        ms = timed(lambda a=a, b=b: gemm(a, b))
        row = {"gemm": name, "M": m, "K": k, "N": n, "exact_first_rows": exact, "ms": ms,
               "int8_tops": 2.0 * m * k * n / ms / 1e9, **_torch_bf16_ms(m, k, n)}
        rows.append(row)
        print(row, flush=True)
        _partial(work, "gemm_int8", {"rows": rows, "all_exact": all(r["exact_first_rows"] for r in rows)})
    return {"rows": rows, "all_exact": all(r["exact_first_rows"] for r in rows)}


# ---------------------------------------------------------------- training steps against the spec's roots

def _reference() -> dict:
    ref = json.loads(REFERENCE_FILE.read_text())
    from lockstep.spec import SPEC_VERSION

    ref["stale"] = ref.get("SPEC_VERSION") != SPEC_VERSION or ref.get("golden_sha256") != _golden_digest()
    return ref


def _golden_digest() -> str:
    from lockstep.spec import SPEC_VERSION

    path = ROOT / "lockstep" / "conformance" / "golden" / f"spec_v{SPEC_VERSION}.txt"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


def _wait_for(path: Path, seconds: float) -> bool:
    deadline = time.time() + seconds
    while not path.exists() and time.time() < deadline:
        time.sleep(1)  # the shell runs ``numba-reference`` in the background
    return path.exists()


def section_roots(work: Path) -> dict:
    """cupy training steps against two references: the committed spec roots, and numba runs made on this machine."""
    ref = _reference()
    numba_ref = {}
    if _wait_for(work / "numba_reference.json", float(os.environ.get("REFERENCE_WAIT_S", 90))):
        numba_ref = json.loads((work / "numba_reference.json").read_text())["runs"]
    out = {"reference_stale": ref["stale"], "runs": {}}
    for label, args in REFERENCE_RUNS:
        run_dir = work / f"cupy-{label}"
        res = _run_lockstep(["train", *args, "--backend", "cupy", "--out", str(run_dir), "--quiet",
                             "--checkpoint-every", "1000"])
        got = _trajectory_roots(run_dir) if res.returncode == 0 else []
        committed = None if ref["stale"] else ref["runs"][label]["state_roots"]
        here = numba_ref.get(label, {}).get("state_roots")
        wanted = [r for r in (committed, here) if r]
        out["runs"][label] = {"returncode": res.returncode, "cupy": got, "committed_spec": committed,
                              "numba_here": here, "match": bool(got) and bool(wanted) and all(got == w for w in wanted),
                              "references": len(wanted), "numba_here_equals_committed": (here == committed) if here and committed else None,
                              "error": res.stderr.strip().splitlines()[-1:]}
    out["all_match"] = all(r["match"] for r in out["runs"].values())
    return out


def numba_reference(work: Path) -> dict:
    """The reference runs trained with numba on this machine (background job of device_check.sh)."""
    runs = {}
    for label, args in REFERENCE_RUNS:
        run_dir = work / f"numba-{label}"
        res = _run_lockstep(["train", *args, "--backend", "numba", "--out", str(run_dir), "--quiet",
                             "--checkpoint-every", "1"])  # every step: the audit replay needs step 1's checkpoint
        runs[label] = {"returncode": res.returncode,
                       "state_roots": _trajectory_roots(run_dir) if res.returncode == 0 else None}
    out = {"runs": runs}
    (work / "numba_reference.json").write_text(json.dumps(out, indent=2) + "\n")
    return out


def make_reference() -> dict:
    """Train the reference runs here (numba, which conformance proves equal to the spec); write the roots file."""
    import tempfile

    from lockstep.spec import SPEC_VERSION

    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, args in REFERENCE_RUNS:
            run_dir = Path(tmp) / label
            res = _run_lockstep(["train", *args, "--backend", "numba", "--out", str(run_dir), "--quiet",
                                 "--checkpoint-every", "1000"])
            if res.returncode != 0:
                raise SystemExit(f"reference run {label} failed: {res.stderr.strip()}")
            runs[label] = {"args": args, "state_roots": _trajectory_roots(run_dir)}
            if label.startswith("tiny"):  # cheap enough to train with the spec itself: must agree
                spec_dir = Path(tmp) / f"{label}-spec"
                _run_lockstep(["train", *args, "--backend", "spec", "--out", str(spec_dir), "--quiet",
                               "--checkpoint-every", "1000"])
                if _trajectory_roots(spec_dir) != runs[label]["state_roots"]:
                    raise SystemExit(f"reference run {label}: numba and spec state roots differ")
                runs[label]["checked_against"] = "spec"
    ref = {"SPEC_VERSION": SPEC_VERSION, "golden_sha256": _golden_digest(), "backend": "numba",
           "command": "python3 benchmarks/device_check.py make-reference", "runs": runs}
    REFERENCE_FILE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE_FILE.write_text(json.dumps(ref, indent=2) + "\n")
    return ref


# ---------------------------------------------------------------- audit replay of a numba-trained run

def section_replay(work: Path) -> dict:
    run_dir = work / "numba-tiny-int8"
    if not _wait_for(run_dir / "commitment.json", float(os.environ.get("REPLAY_WAIT_S", 90))):
        return {"match": False, "error": "the numba-trained tiny run did not finish (see the numba-reference lines of the log)"}
    cert = work / "replay_certificate.json"
    res = _run_lockstep(["audit", "replay", str(run_dir), "--step", "2", "--backend", "cupy", "--out", str(cert), "--quiet"])
    out = {"returncode": res.returncode, "match": res.returncode == 0,
           "tail": (res.stdout + res.stderr).strip().splitlines()[-5:]}
    if cert.exists():
        out["certificate"] = json.loads(cert.read_text())
    return out


# ---------------------------------------------------------------- the fixed-order float GEMM

def _spec_order_entries(a: np.ndarray, b: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Output entries (rows[i], cols[i]) of a @ b in the spec's order (ascending k, round then flush each step)."""
    from lockstep.spec import fp

    acc = np.zeros(rows.size, dtype=np.float32)
    for k in range(a.shape[1]):
        acc = fp.add(acc, fp.mul(a[rows, k], b[k, cols]))
    return acc


def section_gemm_float(work: Path) -> dict:
    import cupy as cp

    from lockstep.backends import get_backend

    be = get_backend("cupy")
    timed = _cuda_timer(cp)
    rng = np.random.default_rng(0)
    out = {"rows": []}
    for name, m, k, n in (("square 4096", 4096, 4096, 4096), ("100m LM head", 8192, 768, 16384)):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        da, db = be.asarray(a), be.asarray(b)
        c = be.to_numpy(be.matmul(da, db))
        ri, ci = rng.integers(0, m, 32), rng.integers(0, n, 32)
        exact = bool(np.array_equal(c[ri, ci].view(np.uint32), _spec_order_entries(a, b, ri, ci).view(np.uint32)))
        ms = timed(lambda: be.matmul(da, db), reps=5, warm=1)
        row = {"gemm": name, "M": m, "K": k, "N": n, "exact_sampled": exact, "ms": ms,
               "tflops": 2.0 * m * k * n / ms / 1e9}
        out["rows"].append(row)
        print(row, flush=True)
        _partial(work, "gemm_float", out)
    return out


# ---------------------------------------------------------------- PyTorch baseline

def section_torch(work: Path) -> dict:
    import torch

    import torch_baseline

    torch.backends.cuda.matmul.allow_tf32 = False  # stock float32 (PyTorch's default): no TF32
    rows = []
    for model, batch in (("small", 16), ("100m", 8)):
        for dtype in ("float32", "bf16"):
            cfg = torch_baseline.model_config(model, quantize=False)
            r = torch_baseline.bench_step(cfg, batch, steps=5, device="cuda", dtype=dtype)
            rows.append(r)
            print(r, flush=True)
            _partial(work, "torch", {"rows": rows})
    return {"rows": rows}


# ---------------------------------------------------------------- lockstep throughput

def _bench_params(cfg, seed: int) -> dict:
    """Benchmark parameters: scaled normal draws (fast; nothing here is published)."""
    from lockstep.formats.params import param_specs

    rng = np.random.default_rng(seed)
    return {s.name: (np.ones(s.shape, np.float32) if s.init == "ones"
                     else (rng.standard_normal(s.shape, dtype=np.float32) * np.float32(s.std)))
            for s in param_specs(cfg)}


def _lockstep_step_time(model: str, batch: int, steps: int, quantize: bool) -> dict:
    import model_flops

    from lockstep.backends import get_backend
    from lockstep.spec import hashing
    from lockstep.formats.config import train_preset
    from lockstep.formats.state import AdamWState
    from lockstep.formats.schedule import StepPlan
    from lockstep.train.step import GradLayout, apply_update, subtree_sums
    from lockstep.train.storage import step_storage
    from lockstep.formats.state import state_tensors

    cfg = model_flops.model_config(model, quantize=quantize)
    tcfg = dataclasses.replace(train_preset("small"), micro_batch=8)
    be = get_backend("cupy")
    params = _bench_params(cfg, 0)
    opt = AdamWState.zeros(params)
    rng = np.random.default_rng(1)
    storage = step_storage(be, GradLayout.of(cfg).size)  # as the trainer does (device vectors on cupy)
    pool = storage.pool
    params, opt = storage.adopt(params, opt)
    step_s, hash_s = [], []
    for t in range(1, steps + 2):
        windows = rng.integers(0, cfg.vocab_size, (batch, cfg.seq_len + 1), dtype=np.int64)
        plan = StepPlan(t, 0, batch, (t - 1) * batch * cfg.seq_len, cfg.seq_len)
        t0 = time.perf_counter()
        m = len(plan.micro_batches(tcfg.micro_batch))
        [(_, _, summed)] = subtree_sums(params, windows, plan, 0, m, cfg, tcfg, be, pool)
        res = apply_update(params, opt, summed, plan, cfg, tcfg, be, storage=storage)
        pool.give(summed)
        t1 = time.perf_counter()
        params, opt = res.params, res.opt
        h0 = time.perf_counter()
        hashing.state_root(state_tensors(params, opt))
        h1 = time.perf_counter()
        if t > 1:  # the first step compiles and uploads
            step_s.append(t1 - t0)
            hash_s.append(h1 - h0)
        print(f"{model} step {t}: {t1 - t0:.3f} s (state root {h1 - h0:.3f} s)", flush=True)
    s = statistics.median(step_s)
    flops = model_flops.step_flops(cfg, batch)
    return {"model": model, "quantize": quantize, "batch": batch, "seq_len": cfg.seq_len, "steps_timed": len(step_s),
            "step_s": s, "state_root_s": statistics.median(hash_s), "tokens_per_s": batch * cfg.seq_len / s,
            "mfu_vs_bf16_peak": flops / s / model_flops.H200_BF16_PEAK}


def section_throughput(work: Path) -> dict:
    rows = []
    for model, batch, steps in (("small", 16, 3), ("100m", 8, 2)):
        try:
            rows.append(_lockstep_step_time(model, batch, steps, quantize=True))
        except Exception as e:  # noqa: BLE001 - report and go on to the next model
            rows.append({"model": model, "error": f"{type(e).__name__}: {e}"})
        print(rows[-1], flush=True)
        _partial(work, "throughput", {"rows": rows})
    return {"rows": rows}


# ---------------------------------------------------------------- step-time breakdown, measured vs predicted

def _sync():
    import cupy as cp

    cp.cuda.runtime.deviceSynchronize()


def _breakdown(model: str, steps: int) -> dict:
    """Steps of ``model`` on cupy with the state on the device, timed by phase, next to perf_model's prediction."""
    import perf_model

    from lockstep.backends import get_backend
    from lockstep.formats.schedule import StepPlan
    from lockstep.spec import hashing
    from lockstep.formats.state import AdamWState
    from lockstep.backends.state_hash import device_state_root
    from lockstep.train.step import GradLayout, apply_update, subtree_sums
    from lockstep.train.storage import step_storage
    from lockstep.formats.state import state_tensors

    pred = perf_model.predict(model)
    cfg, tcfg = perf_model.model_config(model), perf_model.train_config(model)
    batch = pred["batch"]
    be = get_backend("cupy")
    params = _bench_params(cfg, 0)
    storage = step_storage(be, GradLayout.of(cfg).size)
    params, opt = storage.adopt(params, AdamWState.zeros(params))
    pool = storage.pool
    log = be.capabilities.transfers
    rng = np.random.default_rng(1)
    rows = []
    for t in range(1, steps + 2):
        windows = rng.integers(0, cfg.vocab_size, (batch, cfg.seq_len + 1), dtype=np.int64)
        plan = StepPlan(t, 0, batch, (t - 1) * batch * cfg.seq_len, cfg.seq_len)
        if log is not None:
            log.take()
        _sync()
        t0 = time.perf_counter()
        m = len(plan.micro_batches(tcfg.micro_batch))
        [(_, _, summed)] = subtree_sums(params, windows, plan, 0, m, cfg, tcfg, be, pool)
        _sync()
        t1 = time.perf_counter()
        res = apply_update(params, opt, summed, plan, cfg, tcfg, be, storage=storage)
        _sync()
        t2 = time.perf_counter()
        pool.give(summed)
        moved = log.take() if log is not None else {}
        params, opt = res.params, res.opt
        leaves = be.capabilities.tensor_leaves
        h0 = time.perf_counter()  # the state root again, alone: the hashing inside apply_update
        (hashing.state_root(state_tensors(params, opt)) if leaves is None
         else device_state_root(be, state_tensors(params, opt, host=False)))
        _sync()
        h1 = time.perf_counter()
        row = {"step": t, "kernels_s": t1 - t0, "update_s": max(0.0, (t2 - t1) - (h1 - h0)), "hashing_s": h1 - h0,
               "transfer_bytes": moved, "hashing_on_device": leaves is not None}
        print(model, row, flush=True)
        if t > 1:  # the first step compiles
            rows.append(row)
    med = {k: statistics.median(r[k] for r in rows) for k in ("kernels_s", "update_s", "hashing_s")}
    moved = rows[-1]["transfer_bytes"]
    total_bytes = sum(v["in"] + v["out"] for v in moved.values())
    measured = {"kernels": med["kernels_s"], "update": med["update_s"], "hashing": med["hashing_s"],
                "transfers_bytes": total_bytes, "transfers_predicted_from_bytes_s": total_bytes / perf_model.HOST_LINK_BYTES_S}
    return {"model": model, "batch": batch, "measured_s": measured, "predicted_s": pred["phases_s"],
            "predicted_step_s": pred["step_s"], "measured_step_s": med["kernels_s"] + med["update_s"] + med["hashing_s"],
            "transfer_bytes_last_step": moved, "rows": rows, "prediction_source": pred["ceilings"]}


def section_breakdown(work: Path) -> dict:
    out = []
    for model, steps in (("small", 3), ("medium", 2)):
        try:
            out.append(_breakdown(model, steps))
        except Exception as e:  # noqa: BLE001 - report and go on to the next model
            out.append({"model": model, "error": f"{type(e).__name__}: {e}"})
        _partial(work, "breakdown", {"rows": out})
    return {"rows": out}


def section_open1b(work: Path) -> dict:
    """One open-1b micro-batch (4 x 4096 tokens) on cupy with the bounded-memory options (recomputation,
    the LM head in row chunks)."""
    import perf_model

    from lockstep.train import model as train_model
    from lockstep.train.execution import Execution

    from lockstep.backends import get_backend

    cfg = perf_model.model_config("open-1b")
    be = get_backend("cupy")
    execution = Execution(recompute=True, head_rows=4096)
    params = {k: be.asarray(v) for k, v in _bench_params(cfg, 0).items()}
    rng = np.random.default_rng(1)
    windows = rng.integers(0, cfg.vocab_size, (4, cfg.seq_len + 1), dtype=np.int64)
    times = []
    for _ in range(2):
        _sync()
        t0 = time.perf_counter()
        train_model.loss_and_grads(params, windows, cfg, be, n_global=4 * cfg.seq_len, execution=execution)
        _sync()
        times.append(time.perf_counter() - t0)
        print(f"open-1b micro-batch: {times[-1]:.2f} s", flush=True)
    pred = perf_model.predict("open-1b")
    import cupy as cp

    return {"micro_batch_s": times, "predicted_micro_batch_kernels_s": pred["phases_s"]["kernels"] / pred["M"],
            "peak_gpu_bytes": int(cp.get_default_memory_pool().total_bytes()), "execution": str(execution)}


# ---------------------------------------------------------------- summary

def _load(work: Path, name: str) -> dict:
    """A section's JSON; for a section stopped by its time limit, what it saved so far (``partial``)."""
    for path, partial in ((work / f"{name}.json", False), (work / f"{name}.partial.json", True)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        return dict(data, partial=True) if partial else data
    return {}


def _status_table(work: Path) -> list[dict]:
    rows = []
    path = work / "status.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, rc, secs = line.split("\t")
        rows.append({"section": name, "rc": int(rc), "seconds": int(secs)})
    return rows


def _headline(work: Path, name: str) -> str:
    d = _load(work, name)
    if not d:
        return "-"
    if "error" in d:
        return f"error: {d['error']}"
    if name == "versions":
        backend = str(d.get("backend", "?"))
        backend = backend if backend.startswith("unavailable") else "backend ok"
        return (f"{d.get('gpu', '?')} cc{d.get('compute_capability', '?')}, cupy {d.get('cupy')}, "
                f"torch {d.get('torch')}, nvrtc {d.get('nvrtc', {}).get('version') if isinstance(d.get('nvrtc'), dict) else d.get('nvrtc')}; {backend}")
    if name == "probe":
        return d.get("verdict", "-")
    if name == "conformance":
        return d.get("summary", "-")
    if name == "gemm_int8":
        return f"exact {d.get('all_exact')}; " + ", ".join(
            f"{r['gemm']} {r['int8_tops']:.0f} TOPS (torch int_mm {r.get('torch_int_mm_tops', 0):.0f}, "
            f"bf16 {r.get('torch_bf16_tflops', 0):.0f})" for r in d.get("rows", []))
    if name == "roots":
        return f"all match {d.get('all_match')} (reference stale: {d.get('reference_stale')}); " + ", ".join(
            f"{k} {'ok' if v['match'] else ('DIFFER' if v['returncode'] == 0 else 'ERROR')}"
            for k, v in d.get("runs", {}).items())
    if name == "replay":
        return f"match {d.get('match')}"
    if name == "gemm_float":
        return ", ".join(f"{r['gemm']} {r['tflops']:.1f} TFLOP/s exact {r['exact_sampled']}" for r in d.get("rows", []))
    if name == "torch":
        return ", ".join(f"{r['model']} {r['dtype']} {r['step_s'] * 1e3:.1f} ms {r['tokens_per_s']:.0f} tok/s "
                         f"MFU {100 * r['mfu_vs_bf16_peak']:.1f}%" for r in d.get("rows", []))
    if name == "breakdown":
        return "; ".join(f"{r['model']} measured {r['measured_step_s'] * 1e3:.1f} ms vs predicted {r['predicted_step_s'] * 1e3:.1f} ms "
                         f"(kernels {r['measured_s']['kernels'] * 1e3:.1f}/{r['predicted_s']['kernels'] * 1e3:.1f}, "
                         f"hashing {r['measured_s']['hashing'] * 1e3:.1f}/{r['predicted_s']['hashing'] * 1e3:.2f}, "
                         f"transfers {r['measured_s']['transfers_bytes']} B)" if "measured_s" in r else f"{r.get('model')} {r.get('error')}"
                         for r in d.get("rows", []))
    if name == "open1b":
        return d.get("skipped") or f"{d.get('micro_batch_s')} s per micro-batch (predicted {d.get('predicted_micro_batch_kernels_s', 0):.2f} s)"
    if name == "throughput":
        return ", ".join(f"{r['model']} {r['step_s'] * 1e3:.0f} ms {r['tokens_per_s']:.0f} tok/s "
                         f"MFU {100 * r['mfu_vs_bf16_peak']:.1f}%" if "step_s" in r else f"{r.get('model')} {r.get('error')}"
                         for r in d.get("rows", []))
    return "-"


def _tax(work: Path) -> dict:
    lock = {r["model"]: r for r in _load(work, "throughput").get("rows", []) if "step_s" in r}
    torch_rows = {(r["model"], r["dtype"]): r for r in _load(work, "torch").get("rows", [])}
    tax = {}
    for model, r in lock.items():
        for dtype in ("float32", "bf16"):
            if (model, dtype) in torch_rows:
                tax[f"{model} vs torch {dtype}"] = r["step_s"] / torch_rows[(model, dtype)]["step_s"]
    return tax


def summary(work: Path, out: Path) -> dict:
    status = _status_table(work)
    names = [s["section"] for s in status]
    result = {"sections": status, "tax": _tax(work)}
    for name in names:
        result[name] = _load(work, name)
    (out / "device_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print("\n==== device_check summary (details: device_check.json, device_check.log) ====")
    for s in status:
        state = "ok" if s["rc"] == 0 else ("TIMEOUT" if s["rc"] in (124, 137) else f"FAIL rc={s['rc']}")
        print(f"{s['section']:<12} {state:<10} {s['seconds']:>4}s  {_headline(work, s['section'])[:300]}")
    for k, v in result["tax"].items():
        print(f"tax {k}: {v:.2f}x")
    return result


SECTIONS = {"versions": section_versions, "conformance": section_conformance, "probe": section_probe, "gemm_int8": section_gemm_int8,
            "roots": section_roots, "replay": section_replay, "gemm_float": section_gemm_float,
            "torch": section_torch, "throughput": section_throughput, "breakdown": section_breakdown,
            "open1b": section_open1b}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("section", choices=[*SECTIONS, "summary", "make-reference", "numba-reference"])
    ap.add_argument("--work", default="", help="folder for the sections' JSON and run directories")
    ap.add_argument("--out", default="", help="summary: where device_check.json goes")
    args = ap.parse_args(argv)
    if args.section == "make-reference":
        print(json.dumps(make_reference(), indent=2))
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.section == "numba-reference":
        numba_reference(work)
        return 0
    if args.section == "summary":
        summary(work, Path(args.out or args.work))
        return 0
    try:
        data = SECTIONS[args.section](work)
    except Exception as e:  # noqa: BLE001 - a failed section is a result: record it, let the next one run
        import traceback

        traceback.print_exc()
        _write(work, args.section, {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]})
        return 1
    _write(work, args.section, data)
    ok = {"conformance": lambda d: d.get("returncode") == 0, "probe": lambda d: d.get("verdict", "").startswith("rn+flush vs spec: 0 "),
          "gemm_int8": lambda d: d.get("all_exact"), "roots": lambda d: d.get("all_match"),
          "replay": lambda d: d.get("match"),
          "gemm_float": lambda d: all(r["exact_sampled"] for r in d.get("rows", [])),
          "throughput": lambda d: all("step_s" in r for r in d.get("rows", [])),
          "breakdown": lambda d: all("measured_s" in r for r in d.get("rows", []))}.get(args.section, lambda d: True)
    return 0 if ok(data) else 2


if __name__ == "__main__":
    sys.exit(main())
