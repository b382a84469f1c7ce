"""lockstep.formats: the files a run is made of, what ``train`` writes and ``audit``/``use`` read.

* ``config``: the model and training settings a recipe records (presets included);
* ``params``: the model's parameters (names, shapes) in canonical order: the state's layout;
* ``schedule``: which windows step t consumes (batch ramp) and its learning rate;
* ``rundir``: the run directory (recipe, trajectory and its chain, target, commitment, metrics);
* ``checkpoint``: ``checkpoints/step-NNNNNNNN`` (sidecar, marker, state), written atomically;
* ``manifest``, ``stream``, ``tokenizer``: a data folder, the global stream of windows, the ids;
* ``ingest``, ``corpus``: writing a data folder (your text; the embedded default corpus).

Every reader treats its file as untrusted (``lockstep.fsio``): no pickle, no path
escapes, digests checked before use, bytes used from the buffer that was hashed.
"""
