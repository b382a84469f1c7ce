"""Parameter init rate: the spec's NumPy draws against the Numba ``truncated_normal`` capability.

``init_params(cfg, seed)`` (spec, pure NumPy) and ``init_params(cfg, seed, numba)`` give
the same bits (checked here on the timed slice, and in tests/test_rng_backend.py); this
measures parameters per second of each in one process, wall and CPU time, and projects
Open-1B's init (1.6B parameters) from the Numba rate. The slice is Open-1B's shapes with
fewer layers and a smaller vocabulary (``--layers 4 --vocab 8192``: 214M parameters);
the spec baseline runs on a smaller slice (its rate does not depend on size).

    NUMBA_NUM_THREADS=2 python benchmarks/bench_init.py [--layers 4] [--vocab 8192] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

from lockstep.backends import get_backend
from lockstep.formats.config import preset
from lockstep.formats.params import param_count
from lockstep.train.model import init_params


def timed(fn) -> tuple[float, float, object]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spec-layers", type=int, default=1, help="layers of the spec baseline's slice")
    args = ap.parse_args()
    nb = get_backend("numba")
    big = dataclasses.replace(preset("open-1b"), n_layers=args.layers, vocab_size=args.vocab)
    small = dataclasses.replace(big, n_layers=args.spec_layers, vocab_size=1024)
    full = param_count(preset("open-1b"))
    init_params(dataclasses.replace(preset("tiny")), 0, nb)  # compile (or load) the kernels first
    # the same bits: the spec slice drawn both ways
    ref = init_params(small, 1)
    got = init_params(small, 1, nb)
    assert all(ref[k].tobytes() == got[k].tobytes() for k in ref), "numba init differs from the spec"
    spec_rates, numba_rates, numba_cpu = [], [], []
    for _ in range(args.repeats):
        w, _c, _ = timed(lambda: init_params(small, 1))
        spec_rates.append(param_count(small) / w)
        w, c, out = timed(lambda: init_params(big, 1, nb))
        del out
        numba_rates.append(param_count(big) / w)
        numba_cpu.append(c)
    rate = statistics.median(numba_rates)
    print(json.dumps({
        "threads": nb.info.get("threads"), "slice_params": param_count(big), "spec_slice_params": param_count(small),
        "spec_params_per_s": statistics.median(spec_rates), "numba_params_per_s": rate,
        "speedup": rate / statistics.median(spec_rates), "numba_cpu_s_median": statistics.median(numba_cpu),
        "open_1b_params": full, "open_1b_projected_s": full / rate,
        "open_1b_spec_projected_s": full / statistics.median(spec_rates)}, indent=1))


if __name__ == "__main__":
    main()
