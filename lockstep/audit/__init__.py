"""The audit: check a run directory someone else produced, and replay its steps.

* ``verify.verify_run``: everything that needs no training arithmetic (the layout,
  the recipe and H_0, the chain, every checkpoint's tensors and state root against
  the trajectory, the data shards, the commitment).
* ``replay.replay_step`` / ``replay_steps``: recompute steps from the newest verified
  checkpoint before them on one process (the spec's micro-batch tree needs no
  world size), and compare state roots and chain hashes with the trajectory.
* ``certificate``: the signed JSON record an auditor publishes for a replay.
* ``plan.plan_audit``: who replays which step, drawn with Philox from the run's
  final commitment and a public beacon value named after it, the auditors named by
  their public keys; ``merge.merge_certificates``: coverage, disagreements, gaps.

Nothing read from a run directory, a plan or a certificate is ever executed or
unpickled. Files inside a run are opened by walking down from the run directory
without following any symlink (``lockstep.fsio.open_regular``): regular files only,
never a FIFO or a device, each within a stated size cap, read once. Every digest is
checked before the thing it covers is used, every count is bounded before anything
is sized by it, and every string from a file is escaped before it is printed. The
threat model (who may be hostile, what each command promises) is in the README.
"""


from .verify import Finding, Report, verify_run

__all__ = ["Finding", "Report", "verify_run"]
