"""The conformance records, one module per spec module and named like it.

``ops/<module>.py`` holds, for every op that ``lockstep/spec/<module>.py`` defines, its
fixed conformance cases, its search strategy and the regressions the search found
(``registry.OpRecord``). Importing this package registers them all.
"""

from . import (attention, embedding, fp, layout, loss, norm, optim, philox, quant, reduce, rope, swiglu,  # noqa: F401
               transcendental)
