"""ctypes bindings of the two attnres shared libraries.

libAttnResRuntime (no MLIR, no LLVM) loads bundles and launches kernels;
libAttnResCAPI (MLIR and LLVM inside) compiles specs and modules to bundles.
The runtime is needed for anything that runs kernels; the compiler only for
compiling: a machine without LLVM works from prebuilt bundles.

The libraries are looked up in, in order: the folder named by
ATTNRES_LIBRARY_DIR, the package's own ``lib/`` folder (filled by
``pip install`` from a built tree), the library folder of an installed
attnres whose ``lib/attnres/python/`` the package sits in (``cmake
--install``, docs/Embedding.md), and the build folder of the source tree the
package sits in (``<repo>/build/lib``).
"""

import ctypes
import os
import pathlib

from .errors import (AttnresError, BundleError, CompileError, DriverError,
                     InvalidArgumentError, LibraryNotFoundError,
                     NoDriverError)

_RUNTIME = "libAttnResRuntime.so"
_COMPILER = "libAttnResCAPI.so"


def library_dirs():
    """The folders searched for the shared libraries, first match wins."""
    dirs = []
    if os.environ.get("ATTNRES_LIBRARY_DIR"):
        dirs.append(pathlib.Path(os.environ["ATTNRES_LIBRARY_DIR"]))
    here = pathlib.Path(__file__).resolve().parent
    dirs.append(here / "lib")
    if here.parent.name == "python" and here.parent.parent.name == "attnres":
        dirs.append(here.parent.parent.parent)  # <prefix>/lib
    dirs.append(here.parent.parent / "build" / "lib")
    return dirs


def _find(name):
    for folder in library_dirs():
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return None


def _open(name, what):
    path = _find(name)
    if path is None:
        searched = ", ".join(str(d) for d in library_dirs())
        raise LibraryNotFoundError(
            f"cannot find {name} ({what}); searched {searched}. Build attnres "
            f"(scripts/build.sh) or set ATTNRES_LIBRARY_DIR to the folder "
            f"holding it")
    try:
        return ctypes.CDLL(str(path))
    except OSError as error:
        raise LibraryNotFoundError(f"cannot load {path}: {error}") from None


# --- the runtime -----------------------------------------------------------

OK, INVALID_ARGUMENT, BUNDLE, NO_DRIVER, DRIVER = 0, 1, 2, 3, 4
_STATUS_ERRORS = {INVALID_ARGUMENT: InvalidArgumentError, BUNDLE: BundleError,
                  NO_DRIVER: NoDriverError, DRIVER: DriverError}

_p = ctypes.c_void_p
_i64 = ctypes.c_int64


class ForwardArgs(ctypes.Structure):
    _fields_ = [("num_tokens", _i64), ("sources", _p), ("query", _p),
                ("key_norm", _p), ("output_norm", _p), ("o", _p),
                ("lse", _p), ("o_pre", _p), ("partitions", _i64),
                ("workspace", _p), ("workspace_size", ctypes.c_size_t),
                ("o_pre_residual", _p)]


class BackwardArgs(ctypes.Structure):
    _fields_ = [("num_tokens", _i64), ("sources", _p), ("query", _p),
                ("key_norm", _p), ("output_norm", _p), ("grad", _p),
                ("lse", _p), ("saved", _p), ("grad_sources", _p),
                ("dq", _p), ("dg", _p), ("dh", _p), ("blocks", _i64),
                ("partitions", _i64), ("workspace", _p),
                ("workspace_size", ctypes.c_size_t), ("saved_residual", _p),
                ("grad_lse", _p)]


class MergeArgs(ctypes.Structure):
    _fields_ = [("num_rows", _i64), ("partials", _p), ("partial_lse", _p),
                ("sink", _p), ("output_norm", _p), ("o", _p), ("lse", _p),
                ("o_pre", _p), ("rows_per_weight", _i64),
                ("o_pre_residual", _p)]


_runtime_lib = None
_compiler_lib = None
_compiler_fingerprint = None


def runtime_lib():
    global _runtime_lib
    if _runtime_lib is None:
        lib = _open(_RUNTIME, "the attnres runtime")
        status = ctypes.c_int
        handle = ctypes.c_void_p
        signatures = {
            "attnresRuntimeLoad": (status, [ctypes.c_char_p,
                                            ctypes.POINTER(handle), _p]),
            "attnresRuntimeInspect": (status, [ctypes.c_char_p,
                                               ctypes.POINTER(handle), _p]),
            "attnresRuntimeLoadFromMemory": (
                status, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                         ctypes.c_size_t, ctypes.POINTER(handle), _p]),
            "attnresRuntimeDestroy": (None, [handle]),
            "attnresFreeString": (None, [_p]),
            "attnresRuntimeNumOps": (ctypes.c_int, [handle]),
            "attnresRuntimeOpKind": (ctypes.c_char_p, [handle, ctypes.c_int]),
            "attnresRuntimeOpDescription": (ctypes.c_char_p,
                                            [handle, ctypes.c_int]),
            "attnresRuntimeMultiprocessors": (ctypes.c_int, [handle]),
            "attnresForwardWorkspaceSize": (
                status, [handle, ctypes.c_int, _i64, _i64,
                         ctypes.POINTER(ctypes.c_size_t), _p]),
            "attnresForwardPartitions": (_i64, [handle, ctypes.c_int, _i64]),
            "attnresForward": (status, [handle, ctypes.c_int,
                                        ctypes.POINTER(ForwardArgs), _p, _p]),
            "attnresBackwardWorkspaceSize": (
                status, [handle, ctypes.c_int, _i64, _i64, _i64,
                         ctypes.POINTER(ctypes.c_size_t), _p]),
            "attnresBackwardBlocks": (_i64, [handle, ctypes.c_int, _i64]),
            "attnresBackwardPartitions": (_i64, [handle, ctypes.c_int, _i64]),
            "attnresBackward": (status, [handle, ctypes.c_int,
                                         ctypes.POINTER(BackwardArgs), _p,
                                         _p]),
            "attnresMerge": (status, [handle, ctypes.c_int,
                                      ctypes.POINTER(MergeArgs), _p, _p]),
            "attnresSum": (status, [handle, ctypes.c_int, _p, _p, _i64, _p,
                                    _p]),
        }
        for name, (restype, argtypes) in signatures.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
        _runtime_lib = lib
    return _runtime_lib


def check_status(status, error, free):
    """Raises the exception for a runtime status, with its message."""
    if status == OK:
        return
    message = "attnres runtime error"
    if error.value:
        message = ctypes.string_at(error.value).decode(errors="replace")
        free(error)
    raise _STATUS_ERRORS.get(status, AttnresError)(message)


def runtime_call(name, *args):
    """Calls runtime function `name` whose last parameter is char **error."""
    lib = runtime_lib()
    error = ctypes.c_void_p()
    status = getattr(lib, name)(*args, ctypes.byref(error))
    check_status(status, error, lib.attnresFreeString)


# --- the compiler ----------------------------------------------------------

class CompileOptions(ctypes.Structure):
    _fields_ = [("target", ctypes.c_char_p), ("format", ctypes.c_char_p),
                ("opt_level", ctypes.c_int),
                ("kernel_options", ctypes.c_char_p)]


def compiler_available():
    """Whether the compiler library can be found (it needs LLVM/MLIR)."""
    try:
        compiler_lib()
        return True
    except LibraryNotFoundError:
        return False


def compiler_lib():
    global _compiler_lib
    if _compiler_lib is None:
        lib = _open(_COMPILER, "the attnres compiler, which needs LLVM/MLIR 22")
        bundle = ctypes.c_void_p
        signatures = {
            "attnresCompileSpec": (bundle, [ctypes.c_char_p,
                                            ctypes.POINTER(CompileOptions),
                                            _p]),
            "attnresCompileSource": (bundle, [ctypes.c_char_p,
                                              ctypes.c_size_t,
                                              ctypes.POINTER(CompileOptions),
                                              _p]),
            "attnresBundleManifest": (ctypes.c_char_p, [bundle]),
            "attnresBundleNumFiles": (ctypes.c_size_t, [bundle]),
            "attnresBundleFileName": (ctypes.c_char_p,
                                      [bundle, ctypes.c_size_t]),
            "attnresBundleFileData": (_p, [bundle, ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_size_t)]),
            "attnresBundleWrite": (ctypes.c_int, [bundle, ctypes.c_char_p,
                                                  _p]),
            "attnresBundleDestroy": (None, [bundle]),
            "attnresCompilerVersion": (ctypes.c_char_p, []),
            "attnresCompilerFreeString": (None, [_p]),
        }
        for name, (restype, argtypes) in signatures.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
        _compiler_lib = lib
    return _compiler_lib


def compiler_fingerprint():
    """The first 16 hex digits of the SHA-256 of the loaded compiler
    library's file: what the disk cache of bundles is keyed by beside the
    compiler's version, which stays the same from one build to the next
    while the kernels it emits change."""
    global _compiler_fingerprint
    if _compiler_fingerprint is None:
        import hashlib
        digest = hashlib.sha256()
        # (A CDLL keeps the path it was opened from.)
        with open(compiler_lib()._name, "rb") as library:
            for block in iter(lambda: library.read(1 << 20), b""):
                digest.update(block)
        _compiler_fingerprint = digest.hexdigest()[:16]
    return _compiler_fingerprint


def compile_error(error, lib):
    message = "compilation failed"
    if error.value:
        message = ctypes.string_at(error.value).decode(errors="replace")
        lib.attnresCompilerFreeString(error)
    return CompileError(message)
