"""The conformance records, one module per spec module and named like it.

``ops/<module>.py`` holds, for every op that ``lockstep/spec/<module>.py`` defines, its
fixed conformance cases, its search strategy and the regressions the search found, as
plain data: its ``RECORDS``, a tuple of ``record.OpRecord``. ``MODULES`` maps each spec
module of ``spec.OP_MODULES`` to its records' module; the registry
(``lockstep.conformance.registry``) reads them in the order of ``spec.OP_TABLE``.
"""

from . import attention, embedding, fp, layout, loss, norm, optim, philox, quant, reduce, rope, swiglu, transcendental

MODULES = {m.__name__.rsplit(".", 1)[1]: m for m in (attention, embedding, fp, layout, loss, norm, optim, philox,
                                                     quant, reduce, rope, swiglu, transcendental)}
