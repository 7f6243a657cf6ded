"""attnres: Attention Residuals compiled to GPU kernels.

* :func:`compile` (needs the compiler library, i.e. LLVM/MLIR 22) turns a
  spec or MLIR module into a kernel bundle; :func:`load` runs one (needs
  only the runtime library and a GPU driver); :func:`inspect` reads one
  anywhere.
* :func:`attnres`, :func:`attnres_partial` and :func:`partition_reduce` are
  the PyTorch ops (import PyTorch >= 2.4 on first use);
  ``attnres.distributed`` shards the sources of one AttnRes over the ranks of
  a ``torch.distributed`` process group.
"""

from .errors import (AttnresError, BundleError, CompileError, DriverError,
                     InvalidArgumentError, LibraryNotFoundError,
                     NoDriverError)
from .compiler import CompiledBundle, compile, compiler_version
from .kernels import prebuild
from .runtime import Runtime, inspect, load

__version__ = "0.1.0"

_TORCH_OPS = ("attnres", "attnres_partial", "partition_reduce")


def __getattr__(name):
    if name in _TORCH_OPS:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'attnres' has no attribute {name!r}")


__all__ = ["AttnresError", "BundleError", "CompileError", "DriverError",
           "InvalidArgumentError", "LibraryNotFoundError", "NoDriverError",
           "CompiledBundle", "compile", "compiler_version", "prebuild",
           "Runtime", "inspect", "load", "attnres", "attnres_partial",
           "partition_reduce"]
