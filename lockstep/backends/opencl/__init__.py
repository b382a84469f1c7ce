"""The OpenCL backend: the shared kernels (``lockstep/backends/kernels``) on any OpenCL device.

On a machine without a GPU it runs on the CPU through PoCL (``pip install 'lockstep[opencl]'``
installs PyOpenCL with PoCL), which is how CI proves the GPU kernels byte for byte against the
spec. Device: ``LOCKSTEP_OPENCL_DEVICE`` (``P:D`` platform and device indices, or part of the
device name), else the first GPU, else the first other device. The program is built once per
process with ``-cl-fp32-correctly-rounded-divide-sqrt`` (and ``#pragma OPENCL FP_CONTRACT OFF``
in the source); its binary is cached on disk, keyed by the source digest, the options and the
device. Arrays stay on the device between ops.
"""

from __future__ import annotations

from lockstep.backends.kernels.backend import kernel_backend

from .runtime import OpenCLRuntime, open_runtime  # noqa: F401  (raises BackendUnavailable)


def make_backend(self_test: bool = True):
    """The opencl backend on the chosen device (``BackendUnavailable`` with one line if there is none).

    ``self_test=False``: only for the validation report (see ``kernels.backend.open_runtime``)."""
    rt = open_runtime(self_test=self_test)
    return kernel_backend(rt, "opencl", {"device": rt.device_name}, self_test=self_test)
