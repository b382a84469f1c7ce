"""Which backend a replay trusts when the user does not name one: the fastest that passes conformance here.

The ranking (``lockstep.backends.FASTEST_FIRST``) is the backends' own; the trust
check is the conformance suite's (level 1: every op against the spec, byte for byte).
"""

from __future__ import annotations

import io
import time


def choose_backend(log=None) -> tuple[object, str]:
    """The fastest installed backend that passes conformance here, and a line saying why it was chosen.

    Tried in ``FASTEST_FIRST`` order: one that is not installed (or cannot load) is
    passed over; one that loads must pass ``lockstep conformance`` level 1 (every op
    against the spec, byte for byte) before a replay trusts it. The spec is the last
    resort.
    """
    from lockstep import backends
    from lockstep.conformance import runner

    log = log or (lambda msg: None)
    passed_over = []
    for name in backends.FASTEST_FIRST:
        try:
            be = backends.get_backend(name)
        except Exception as exc:  # noqa: BLE001 - not installed or not loadable here: try the next
            first = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
            passed_over.append(f"{name}: {first}")
            continue
        log(f"checking backend {name} against the spec (conformance level 1) before the replay trusts it ...")
        t0 = time.perf_counter()
        results = runner.run_conformance(be, level=1, progress=False, out=io.StringIO())
        if runner.all_passed(results):
            return be, (f"{name}, the fastest installed backend; it passed conformance level 1 here "
                        f"({len(results)} ops, {time.perf_counter() - t0:.0f}s)")
        failed = [r.op for r in results if r.status != "PASS"]
        passed_over.append(f"{name}: failed conformance on {', '.join(failed[:5])}")
    return backends.spec_backend(), f"spec, the reference (no faster backend passed conformance here: {'; '.join(passed_over)})"
