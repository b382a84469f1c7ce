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

from lockstep.backends.kernels.ops import make_backend as _kernel_backend

from .runtime import OpenCLRuntime, open_runtime  # noqa: F401  (raises BackendUnavailable)


def make_backend():
    """The opencl backend on the chosen device (``BackendUnavailable`` with one line if there is none)."""
    rt = open_runtime()
    return _kernel_backend(rt, "opencl", rt.description, {"device": rt.device_name})
