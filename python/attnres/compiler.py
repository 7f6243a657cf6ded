"""Compiling attnres ops to kernel bundles (needs libAttnResCAPI, i.e. LLVM).

A bundle is the folder attnres-compile writes: one GPU binary and a
manifest.json (docs/Bundle.md); :func:`attnres.load` runs it.
"""

import ctypes
import json
import os
import pathlib

from . import _native
from .errors import InvalidArgumentError


class CompiledBundle:
    """A bundle in memory: its manifest and files, writable to a folder."""

    def __init__(self, handle):
        self._handle = handle
        lib = _native.compiler_lib()
        self.manifest_text = lib.attnresBundleManifest(handle).decode()
        self.files = {}
        for index in range(lib.attnresBundleNumFiles(handle)):
            name = lib.attnresBundleFileName(handle, index).decode()
            size = ctypes.c_size_t()
            data = lib.attnresBundleFileData(handle, index, ctypes.byref(size))
            self.files[name] = ctypes.string_at(data, size.value)
        lib.attnresBundleDestroy(handle)
        self._handle = None

    @property
    def manifest(self):
        return json.loads(self.manifest_text)

    def write(self, directory):
        """Writes manifest.json and the binaries into `directory` atomically
        (a half-written bundle is never seen by another process)."""
        directory = pathlib.Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
        staging.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            (staging / name).write_bytes(data)
        (staging / "manifest.json").write_text(self.manifest_text)
        try:
            os.replace(staging, directory)
        except OSError:
            # Another process won the race, or the folder exists: keep it.
            for child in staging.iterdir():
                child.unlink()
            staging.rmdir()
            if not (directory / "manifest.json").is_file():
                raise
        return directory


def _options(target, format, opt_level, kernel_options=""):
    if not isinstance(target, str) or not target:
        raise InvalidArgumentError(f"target must be a chip name such as "
                                   f"'sm_90' or 'gfx942', got {target!r}")
    if format not in ("bin", "isa", "fatbin"):
        raise InvalidArgumentError(
            f"format must be 'bin', 'isa' or 'fatbin', got {format!r}")
    if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
        raise InvalidArgumentError(
            f"opt_level must be an int in [0, 3], got {opt_level!r}")
    if not isinstance(kernel_options, str):
        raise InvalidArgumentError(
            f"kernel_options must be a str of convert-attnres-to-gpu options "
            f"such as 'backward-source-batch=4', got {kernel_options!r}")
    return _native.CompileOptions(target.encode(), format.encode(), opt_level,
                                  kernel_options.encode())


def compile(spec=None, *, module=None, target="sm_90", output=None,
            format="bin", opt_level=3, kernel_options=""):
    """Compiles one op spec (``"train:L=8,D=1024,dtype=bf16"``, see
    docs/Bundle.md) or the attnres ops of MLIR `module` text for `target`.
    `kernel_options` overrides the lowering's choices (lanes of a row,
    batches of sources, prefetching: ``attnres-opt --help``, under
    convert-attnres-to-gpu); the defaults come from measurements.

    Returns the :class:`CompiledBundle`; with `output`, also writes it there.
    Raises :class:`attnres.CompileError` with the compiler's message when the
    spec, module or target is refused.
    """
    if (spec is None) == (module is None):
        raise InvalidArgumentError("give exactly one of spec and module")
    options = _options(target, format, opt_level, kernel_options)
    lib = _native.compiler_lib()
    error = ctypes.c_void_p()
    if spec is not None:
        if not isinstance(spec, str):
            raise InvalidArgumentError(f"spec must be a str, got {spec!r}")
        handle = lib.attnresCompileSpec(spec.encode(), ctypes.byref(options),
                                        ctypes.byref(error))
    else:
        if not isinstance(module, str):
            raise InvalidArgumentError("module must be MLIR text (a str)")
        text = module.encode()
        handle = lib.attnresCompileSource(text, len(text),
                                          ctypes.byref(options),
                                          ctypes.byref(error))
    if not handle:
        raise _native.compile_error(error, lib)
    bundle = CompiledBundle(handle)
    if output is not None:
        bundle.write(output)
    return bundle


def compiler_version():
    """``attnres <version> (LLVM <version>)`` of the compiler library."""
    return _native.compiler_lib().attnresCompilerVersion().decode()
