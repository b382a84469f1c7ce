"""``lockstep conformance --report FILE``: the device report a contributor attaches to an issue.

Run here on the OpenCL backend (PoCL), which is built from the same kernels as Metal: the report's
three checks (conformance, training steps against the spec, the flush probe), its Markdown and
JSON, its exit statuses, and what it says when a backend is unavailable or fails its self-test.
"""

from __future__ import annotations

import json
import re

import pytest

from lockstep.backends import BackendUnavailable, get_backend
from lockstep.conformance import report as device_report
from lockstep.contract.vectors import FLUSH_VECTORS, SMALLEST_NORMAL

try:
    get_backend("opencl")
    _SKIP = None
except BackendUnavailable as e:  # pragma: no cover - CI installs pyopencl[pocl]
    _SKIP = str(e)

needs_opencl = pytest.mark.skipif(_SKIP is not None, reason=f"opencl backend unavailable: {_SKIP}")
ONE_SHORT_RUN = (("tiny-float", ["--preset", "tiny", "--steps", "1", "--no-quantize"]),)


def _json_of(markdown: str) -> dict:
    return json.loads(re.search(r"```json\n(.*?)\n```", markdown, re.DOTALL).group(1))


@needs_opencl
def test_a_report_on_opencl_passes_and_holds_every_section(tmp_path):
    rep = device_report.build_report("opencl", level=1, probe_pairs=10**5, runs=ONE_SHORT_RUN, sqrt_count=1 << 18)
    assert rep["verdict"].startswith("PASS"), rep["verdict"]
    assert device_report.exit_status(rep) == 0
    assert rep["conformance"]["passed"] and rep["conformance"]["counts"]["FAIL"] == 0
    run = rep["training"]["runs"][0]
    assert run["equal"] and run["backend"]["steps"][0]["state_root"] == run["spec"]["steps"][0]["state_root"]
    assert run.get("committed_reference_roots_equal_the_spec") in (True, None)
    probe = rep["flush_probe"]
    assert probe["ops_equal_spec"] and probe["random"]["mul"]["rule"] == "keeps subnormals (IEEE gradual underflow)"
    assert probe["rounding"]["sqrt"]["count"] == 1 << 18 and probe["rounding"]["sqrt"]["mismatches"] == 0
    assert probe["rounding"]["div_extreme_divisors"]["mismatches"] == 0
    path = tmp_path / "report.md"
    device_report.write_report(rep, path)
    text = path.read_text()
    for heading in ("# lockstep device report: backend `opencl`", "## Conformance, level 1",
                    "## Training steps against the spec", "## Flush probe", f"| {FLUSH_VECTORS[0].label} | 0x{SMALLEST_NORMAL:08X} |",
                    "- sqrt on every float32 in [0x3F800000, 0x3F840000) (262144): 0 differ from the spec"):
        assert heading in text, heading
    assert _json_of(text)["verdict"] == rep["verdict"]


def test_an_unavailable_backend_still_gets_a_report(tmp_path, capsys):
    from lockstep.cli import main

    path = tmp_path / "metal.md"
    status = main(["conformance", "--backend", "metal", "--report", str(path)])
    if status == 0:  # pragma: no cover - a Mac with a working Metal GPU
        pytest.skip("the metal backend runs here")
    assert status == 1
    data = _json_of(path.read_text())
    assert data["verdict"].startswith("UNAVAILABLE: backend 'metal'") and "conformance" not in data
    assert "attach it to an issue" in capsys.readouterr().out


def test_report_flags_are_checked_first(tmp_path, capsys):
    from lockstep.cli import main

    assert main(["conformance", "--backend", "spec", "--ops", "add", "--report", str(tmp_path / "r.md")]) == 1
    assert main(["conformance", "--backend", "spec", "--report", str(tmp_path / "no" / "r.md")]) == 1
    err = capsys.readouterr().err
    assert "drop --ops" in err and "is not a folder" in err
    assert not list(tmp_path.iterdir())


@needs_opencl
def test_a_backend_that_fails_its_self_test_is_checked_anyway(monkeypatch):
    """The diagnostic path (what a Mac whose GPU computes other bits needs): the self-test's refusal is
    recorded, the backend is reopened without it, and the checks run; the verdict is DIFFERS."""
    import lockstep.backends as backends
    import lockstep.backends.opencl as opencl_module

    real = get_backend("opencl")

    def refuse(name):
        raise BackendUnavailable("OpenCL device 'x' failed the self-test, so the backend is refused: mul(...)")

    monkeypatch.setattr(backends, "get_backend", refuse)
    monkeypatch.setattr(opencl_module, "make_backend", lambda self_test=True: real)
    rep = device_report.build_report("opencl", level=1, probe_pairs=1000, runs=(), sqrt_count=1 << 10)
    assert rep["self_test"]["status"].startswith("FAILED") and "mul(...)" in rep["self_test"]["reason"]
    assert rep["conformance"]["passed"] and rep["flush_probe"]["ops_equal_spec"]
    assert rep["verdict"].startswith("DIFFERS") and device_report.exit_status(rep) == 2
