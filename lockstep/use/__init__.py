"""Using what was trained: validation loss, sampling text, exporting weights with their proof.

* ``run``: open a run directory from anywhere (untrusted): its recipe, a fully verified
  checkpoint that agrees with the trajectory, its data and tokenizer.
* ``evaluate``: validation loss on the manifest's held-out documents, in nats per token
  and bits per byte, the same bits on every backend.
* ``generate``: the trained model with a KV cache, sampling from Philox keyed by the seed;
  the memory a sample needs, estimated before anything is allocated.
* ``export``: float32 safetensors (and the int8 codes and scales) with the recipe and
  the step's commitment; ``verify_export`` checks an export against its run.
* ``tokenizing``: a run's Hugging Face tokenizer with its library calls guarded (a panic of
  the library is a one-line error).
* ``plots``: ``loss.png`` (training and validation loss over tokens) and comparisons.

Every number that decides a published bit goes through a backend's ops (the spec's
orders); nothing here uses BLAS, ``np.sum`` or ``np.exp`` on floats.
"""
