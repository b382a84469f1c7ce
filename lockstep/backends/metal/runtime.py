"""PyObjC runtime for the shared kernels on an Apple GPU: compile options, pipelines, shared buffers, launches.

Implements ``lockstep.backends.kernels.runtime.Runtime``; it moves bytes and launches kernels of
``kernels.source("metal")`` and never computes a float itself.

* Compile: ``MTLCompileOptions`` with ``mathMode = safe`` and ``mathFloatingPointFunctions =
  precise`` where the OS has them (macOS 15+), else ``fastMathEnabled = NO`` (its default is
  YES); the language version pinned to 2.4; ``#pragma STDC FP_CONTRACT OFF`` is in the source
  (``prelude_metal.h``). The library and one compute pipeline per kernel are built once per
  process, when the runtime opens.
* Buffers: ``MTLResourceStorageModeShared``. On Apple silicon that memory is the CPU's too, so
  uploads write it and downloads read it directly (``contents()``), with no staging copies.
* Launches: ``groups[d]`` threadgroups of ``local[d]`` threads (``dispatchThreadgroups``); a
  ``DeviceArray`` binds its buffer at slot i, scalars and ``ParamBlock`` structs their bytes
  (``setBytes``) at slot i, where i is the argument's position (the kernels declare
  ``[[buffer(i)]]`` that way; ``tests/test_kernels_source.py`` checks it). Dispatches go into one
  serial compute encoder (Metal runs a serial encoder's dispatches in order), committed every
  ``DISPATCHES_PER_COMMAND_BUFFER`` dispatches and before any download, which waits for them.
"""

from __future__ import annotations

import sys

import numpy as np

from lockstep.errors import LockstepError
from lockstep.backends import BackendUnavailable
from lockstep.backends.kernels import kernel_names, source
from lockstep.backends.kernels.layout import DeviceArray
from lockstep.backends.kernels.backend import DeviceRuntime
from lockstep.backends.kernels.runtime import ParamBlock

INSTALL_HINT = "pip install 'lockstep[metal]' (PyObjC's Metal bindings)"
LANGUAGE_VERSION = (2, 4)  # MSL 2.4: macOS 12 and later
MATH_MODE_SAFE = 0  # MTLMathModeSafe (macOS 15+); Relaxed = 1, Fast = 2
MATH_FUNCTIONS_PRECISE = 1  # MTLMathFloatingPointFunctionsPrecise; Fast = 0
COMMAND_BUFFER_ERROR = 5  # MTLCommandBufferStatusError
DISPATCHES_PER_COMMAND_BUFFER = 256
MAX_GROUPS = 4096  # grid-stride kernels need no more threadgroups than this to fill any Apple GPU


class MetalCompileError(LockstepError, RuntimeError):
    """The Metal compiler rejected the kernel source (the message carries its log)."""


def import_metal():
    """PyObjC's ``Metal`` module, or ``BackendUnavailable`` with one line (off macOS, or without PyObjC)."""
    if sys.platform != "darwin":
        system = {"linux": "Linux", "win32": "Windows"}.get(sys.platform, sys.platform)
        raise BackendUnavailable(f"backend 'metal' needs macOS with an Apple GPU (this is {system}); "
                                 "use --backend numba, or opencl for the same kernels on an OpenCL device")
    try:
        import Metal
    except ImportError as e:
        raise BackendUnavailable(f"backend 'metal' needs PyObjC's Metal bindings: {INSTALL_HINT}") from e
    return Metal


def compile_options(Metal) -> tuple[object, list[str]]:
    """``MTLCompileOptions`` with fast math off, and the settings in words (for the description).

    ``mathMode`` safe and ``mathFloatingPointFunctions`` precise where the OS has them (macOS 15+;
    setting ``fastMathEnabled`` there too would be redundant), else ``fastMathEnabled = NO``."""
    opts = Metal.MTLCompileOptions.alloc().init()
    words = []
    if hasattr(opts, "setMathMode_"):
        opts.setMathMode_(getattr(Metal, "MTLMathModeSafe", MATH_MODE_SAFE))
        words.append("mathMode=safe")
        if hasattr(opts, "setMathFloatingPointFunctions_"):
            opts.setMathFloatingPointFunctions_(getattr(Metal, "MTLMathFloatingPointFunctionsPrecise", MATH_FUNCTIONS_PRECISE))
            words.append("mathFloatingPointFunctions=precise")
    else:
        opts.setFastMathEnabled_(False)
        words.append("fastMathEnabled=NO")
    major, minor = LANGUAGE_VERSION
    opts.setLanguageVersion_(getattr(Metal, f"MTLLanguageVersion{major}_{minor}", (major << 16) | minor))
    words.append(f"languageVersion={major}.{minor}")
    return opts, words


def _text(ns_object) -> str:
    """An NSError's description (or any object's str), one line."""
    if ns_object is None:
        return "no details"
    describe = getattr(ns_object, "localizedDescription", None)
    text = str(describe() if callable(describe) else ns_object)
    return " ".join(text.split())


class MetalRuntime(DeviceRuntime, dialect="metal"):
    """One Metal device, its command queue, the compiled library and a pipeline per kernel."""

    def __init__(self, Metal, device):
        super().__init__(device, str(device.name()))
        self.mtl = Metal
        self.unified_memory = bool(device.hasUnifiedMemory()) if hasattr(device, "hasUnifiedMemory") else False
        self.queue = device.newCommandQueue()
        self.options, self.option_words = compile_options(Metal)
        self.library = self._compile()
        self.pipelines = self._pipelines()
        self._command_buffer = None
        self._encoder = None
        self._dispatches = 0
        self._in_flight: list = []
        memory = "unified memory, shared buffers" if self.unified_memory else "shared buffers (not unified memory)"
        self.description = (f"Metal on {self.device_name} ({memory}); {', '.join(self.option_words)}, "
                            f"#pragma STDC FP_CONTRACT OFF; {len(self.pipelines)} pipelines")

    # ------------------------------------------------------------------ build (once per process)

    def _compile(self):
        library, error = self.device.newLibraryWithSource_options_error_(source(self.dialect), self.options, None)
        if library is None:
            raise MetalCompileError(f"the Metal compiler rejected the lockstep kernels on {self.device_name}: {_text(error)}")
        return library

    def _pipelines(self) -> dict:
        pipelines = {}
        for name in kernel_names():
            function = self.library.newFunctionWithName_(name)
            if function is None:
                raise MetalCompileError(f"kernel {name} is missing from the compiled Metal library")
            pipeline, error = self.device.newComputePipelineStateWithFunction_error_(function, None)
            if pipeline is None:
                raise MetalCompileError(f"no Metal pipeline for kernel {name}: {_text(error)}")
            pipelines[name] = pipeline
        return pipelines

    # ------------------------------------------------------------------ Runtime protocol

    def alloc(self, nbytes: int):
        return self.device.newBufferWithLength_options_(max(int(nbytes), 4), self.mtl.MTLResourceStorageModeShared)

    def upload(self, host: np.ndarray):
        host = np.ascontiguousarray(host)
        if host.nbytes == 0:
            return self.alloc(4)
        return self.device.newBufferWithBytes_length_options_(host, host.nbytes, self.mtl.MTLResourceStorageModeShared)

    def download(self, buffer, dtype, count: int, offset: int = 0) -> np.ndarray:
        dtype = np.dtype(dtype)
        self.finish()
        if not count:
            return np.empty(0, dtype=dtype)
        memory = buffer.contents().as_buffer(int(buffer.length()))
        return np.frombuffer(memory, dtype=dtype, count=int(count), offset=int(offset) * dtype.itemsize).copy()

    def launch(self, kernel: str, groups, local, args) -> None:
        pipeline = self.pipelines.get(kernel)
        if pipeline is None:
            raise KeyError(f"no Metal pipeline for kernel {kernel!r}")
        groups = tuple(int(g) for g in groups) + (1,) * (3 - len(groups))
        local = tuple(int(x) for x in local) + (1,) * (3 - len(local))
        limit = int(pipeline.maxTotalThreadsPerThreadgroup())
        if local[0] * local[1] * local[2] > limit:
            raise RuntimeError(f"kernel {kernel} needs threadgroups of {local[0] * local[1] * local[2]} threads; "
                               f"{self.device_name} allows {limit} for it")
        encoder = self._encoder_for_dispatch()
        encoder.setComputePipelineState_(pipeline)
        for slot, arg in enumerate(args):
            if isinstance(arg, DeviceArray):
                encoder.setBuffer_offset_atIndex_(arg.buffer, 0, slot)  # views pass their offsets as int arguments
            elif isinstance(arg, (ParamBlock, np.int32, np.uint32, np.float32)):
                raw = arg.tobytes()
                encoder.setBytes_length_atIndex_(raw, len(raw), slot)
            else:
                raise TypeError(f"kernel {kernel} argument {slot}: DeviceArray, ParamBlock or np.int32/uint32/float32, "
                                f"got {type(arg).__name__}")
        encoder.dispatchThreadgroups_threadsPerThreadgroup_(self.mtl.MTLSize(*groups), self.mtl.MTLSize(*local))
        self._dispatches += 1
        if self._dispatches >= DISPATCHES_PER_COMMAND_BUFFER:
            self._commit()

    def elementwise_groups(self, n: int, local: int) -> int:
        return max(1, min(-(-int(n) // int(local)), MAX_GROUPS))

    # ------------------------------------------------------------------ command buffers

    def _encoder_for_dispatch(self):
        if self._encoder is None:
            self._command_buffer = self.queue.commandBuffer()
            self._encoder = self._command_buffer.computeCommandEncoder()  # serial: dispatches run in order
        return self._encoder

    def _commit(self) -> None:
        if self._encoder is None:
            return
        self._encoder.endEncoding()
        self._command_buffer.commit()
        self._in_flight.append(self._command_buffer)
        self._encoder = self._command_buffer = None
        self._dispatches = 0

    def finish(self) -> None:
        """Commit what is encoded and wait for every command buffer; a failed one raises ``RuntimeError``."""
        self._commit()
        in_flight, self._in_flight = self._in_flight, []
        for command_buffer in in_flight:
            command_buffer.waitUntilCompleted()
            if int(command_buffer.status()) == COMMAND_BUFFER_ERROR:
                raise RuntimeError(f"a Metal command buffer failed on {self.device_name}: {_text(command_buffer.error())}")
