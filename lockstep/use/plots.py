"""Loss curves: a run's training and validation loss over tokens, and runs side by side.

Plots need matplotlib (the ``plot`` extra); without it the functions return None and
nothing is drawn. Files are written atomically (temporary name, then rename). Titles and
labels name runs (a folder's name is its publisher's choice): they are drawn escaped
(``fsio.printable``) and as plain text (no mathtext), so no name reaches a font or the
terminal (a missing glyph is a warning that quotes it) unescaped.
"""

from __future__ import annotations

import io
from pathlib import Path

from lockstep.formats.rundir import BITS_RE, LOSS_PLOT_FILE as LOSS_PNG
from lockstep.formats.trajectory import Strictness, read_trajectory, record_value
from lockstep.fsio import atomic_write_bytes, printable

from .evaluate import recorded_validations


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def run_curves(run_dir: Path, trajectory: list[dict] | None = None) -> tuple[list, list, list, list]:
    """``(train_tokens, train_loss, val_tokens, val_loss)`` of a run (last record per step; the training
    loss from each record's chained bits)."""

    traj = trajectory if trajectory is not None else read_trajectory(run_dir, Strictness.LIVE)
    by_step = {r["step"]: r for r in traj if isinstance(r, dict) and type(r.get("step")) is int
               and type(r.get("tokens")) is int and isinstance(r.get("loss_bits"), str)
               and BITS_RE.fullmatch(r["loss_bits"])}
    steps = sorted(by_step)
    val = recorded_validations(run_dir)
    val_steps = sorted(s for s in val if type(val[s].get("tokens")) is int
                       and isinstance(val[s].get("nats_per_token"), (int, float)))
    return ([by_step[s]["tokens"] for s in steps], [record_value(by_step[s], "loss") for s in steps],
            [val[s]["tokens"] for s in val_steps], [val[s]["nats_per_token"] for s in val_steps])


def _save(fig, plt, path: Path) -> Path:
    buf = io.BytesIO()  # rendered in memory, then written by the one atomic writer
    try:
        fig.savefig(buf, format="png", dpi=120)
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def loss_curve_png(trajectory: list[dict], title: str) -> bytes | None:
    """The loss curve of trajectory records as PNG bytes (None without matplotlib).

    Drawn from the records' chained ``loss_bits`` only (``audit verify --plot`` draws it
    from a valid run; ``loss.png`` is derived from files that are not evidence).
    """
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in trajectory], [record_value(r, "loss") for r in trajectory])
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(printable(title), parse_math=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()  # rendered in memory, then written by the caller's atomic writer
    try:
        fig.savefig(buf, format="png")
    finally:
        plt.close(fig)
    return buf.getvalue()


def plot_run(run_dir: Path, trajectory: list[dict] | None = None, out: Path | None = None) -> Path | None:
    """Draw ``loss.png`` of a run: training loss per step and validation loss where measured,
    both against training tokens."""
    plt = _pyplot()
    if plt is None:
        return None
    run_dir = Path(run_dir)
    tt, tl, vt, vl = run_curves(run_dir, trajectory)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(tt, tl, lw=1, label="training loss (batch mean, with z-loss)")
    if vt:
        ax.plot(vt, vl, "o-", ms=4, label="validation loss (held-out documents)")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(printable(f"{run_dir.name}: loss"), parse_math=False)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(fig, plt, Path(out) if out else run_dir / LOSS_PNG)


def plot_runs(runs: dict[str, Path], out: Path, title: str) -> Path | None:
    """Several runs in one PNG: each run's training loss (thin) and validation loss (markers)."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (label, run_dir) in enumerate(runs.items()):
        tt, tl, vt, vl = run_curves(Path(run_dir))
        color = f"C{i}"
        ax.plot(tt, tl, lw=0.8, alpha=0.6, color=color, label=printable(f"{label}: training"))
        if vt:
            ax.plot(vt, vl, "o-", ms=4, color=color, label=printable(f"{label}: validation"))
    ax.set_xlabel("training tokens")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title(printable(title), parse_math=False)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(fig, plt, Path(out))
