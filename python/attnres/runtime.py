"""Loading bundles and launching their kernels (libAttnResRuntime only).

Pointers are plain ints (device addresses) and streams are driver stream
handles (ints, 0 for the default stream): this layer knows nothing of
PyTorch; :mod:`attnres.torch` builds on it.
"""

import ctypes
import json
import operator
import pathlib

from . import _native
from .errors import InvalidArgumentError


class Op:
    """One op of a bundle: its index, kind and manifest entry."""

    def __init__(self, index, kind, description):
        self.index = index
        self.kind = kind
        self.description = description

    def __getitem__(self, key):
        return self.description[key]

    def get(self, key, default=None):
        return self.description.get(key, default)

    def __repr__(self):
        return f"Op({self.index}, {self.kind!r})"


class Runtime:
    """A loaded (or inspected) bundle."""

    def __init__(self, handle, directory):
        self._handle = handle
        self.directory = directory
        lib = _native.runtime_lib()
        self.ops = []
        for index in range(lib.attnresRuntimeNumOps(handle)):
            kind = lib.attnresRuntimeOpKind(handle, index).decode()
            description = json.loads(
                lib.attnresRuntimeOpDescription(handle, index).decode())
            self.ops.append(Op(index, kind, description))

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and _native._runtime_lib is not None:
            _native._runtime_lib.attnresRuntimeDestroy(handle)

    @property
    def multiprocessors(self):
        return _native.runtime_lib().attnresRuntimeMultiprocessors(
            self._handle)

    def op(self, kind):
        """The first op of `kind` ("forward", "backward", ...)."""
        for op in self.ops:
            if op.kind == kind:
                return op
        raise InvalidArgumentError(
            f"the bundle in {self.directory} has no {kind} op (it has "
            f"{', '.join(o.kind for o in self.ops) or 'none'})")

    # Launch rules: the manifest's, evaluated by the runtime. Every integer
    # is checked to fit the C type it is passed as (ctypes would wrap it
    # around silently); the runtime refuses counts whose sizes do not fit.
    def forward_partitions(self, op, num_tokens):
        return _native.runtime_lib().attnresForwardPartitions(
            self._handle, _index(op), _i64("num_tokens", num_tokens))

    def forward_workspace_size(self, op, num_tokens, partitions=0):
        size = ctypes.c_size_t()
        _native.runtime_call("attnresForwardWorkspaceSize", self._handle,
                             _index(op), _i64("num_tokens", num_tokens),
                             _i64("partitions", partitions),
                             ctypes.byref(size))
        return size.value

    def backward_blocks(self, op, num_tokens):
        return _native.runtime_lib().attnresBackwardBlocks(
            self._handle, _index(op), _i64("num_tokens", num_tokens))

    def backward_partitions(self, op, blocks):
        return _native.runtime_lib().attnresBackwardPartitions(
            self._handle, _index(op), _i64("blocks", blocks))

    def backward_workspace_size(self, op, num_tokens, blocks=0,
                                partitions=0):
        size = ctypes.c_size_t()
        _native.runtime_call("attnresBackwardWorkspaceSize", self._handle,
                             _index(op), _i64("num_tokens", num_tokens),
                             _i64("blocks", blocks),
                             _i64("partitions", partitions),
                             ctypes.byref(size))
        return size.value

    # Launches; every pointer an int (0 for none).
    def forward(self, op, *, num_tokens, sources, query, o, lse,
                key_norm=0, output_norm=0, o_pre=0, o_pre_residual=0,
                partitions=0, workspace=0, workspace_size=0, stream=0):
        args = _native.ForwardArgs(**_fields(
            _native.ForwardArgs, num_tokens=num_tokens, sources=sources,
            query=query, key_norm=key_norm, output_norm=output_norm, o=o,
            lse=lse, o_pre=o_pre, partitions=partitions, workspace=workspace,
            workspace_size=workspace_size, o_pre_residual=o_pre_residual))
        _native.runtime_call("attnresForward", self._handle, _index(op),
                             ctypes.byref(args), _u64("stream", stream))

    def backward(self, op, *, num_tokens, sources, query, grad,
                 grad_sources, dq, lse=0, saved=0, saved_residual=0,
                 key_norm=0, output_norm=0, dg=0, dh=0, blocks=0,
                 partitions=0, workspace=0, workspace_size=0, stream=0,
                 grad_lse=0):
        args = _native.BackwardArgs(**_fields(
            _native.BackwardArgs, num_tokens=num_tokens, sources=sources,
            query=query, key_norm=key_norm, output_norm=output_norm,
            grad=grad, lse=lse, saved=saved, grad_sources=grad_sources,
            dq=dq, dg=dg, dh=dh, blocks=blocks, partitions=partitions,
            workspace=workspace, workspace_size=workspace_size,
            saved_residual=saved_residual, grad_lse=grad_lse))
        _native.runtime_call("attnresBackward", self._handle, _index(op),
                             ctypes.byref(args), _u64("stream", stream))

    def merge(self, op, *, num_rows, partials, partial_lse, o, lse, sink=0,
              output_norm=0, o_pre=0, o_pre_residual=0, rows_per_weight=0,
              stream=0):
        args = _native.MergeArgs(**_fields(
            _native.MergeArgs, num_rows=num_rows, partials=partials,
            partial_lse=partial_lse, sink=sink, output_norm=output_norm, o=o,
            lse=lse, o_pre=o_pre,
            rows_per_weight=rows_per_weight or num_rows,
            o_pre_residual=o_pre_residual))
        _native.runtime_call("attnresMerge", self._handle, _index(op),
                             ctypes.byref(args), _u64("stream", stream))

    def sum(self, op, *, partials, output, num_elements, stream=0):
        _native.runtime_call("attnresSum", self._handle, _index(op),
                             _u64("partials", partials),
                             _u64("output", output),
                             _i64("num_elements", num_elements),
                             _u64("stream", stream))


def _whole(name, value, low, high, what):
    """`value` as an int in [low, high]: ctypes would wrap anything else
    around silently (2**64 + 5 passed as an int64_t is 5)."""
    number = value
    if type(number) is not int:  # (the launches' fast path)
        if isinstance(value, bool):
            raise InvalidArgumentError(
                f"{name} must be an int, got {value!r}")
        try:
            number = operator.index(value)
        except TypeError:
            raise InvalidArgumentError(
                f"{name} must be an int, got {type(value).__name__}") from None
    if not low <= number <= high:
        raise InvalidArgumentError(
            f"{name} = {number} does not fit {what} ([{low}, {high}])")
    return number


def _i64(name, value):
    return _whole(name, value, -(1 << 63), (1 << 63) - 1, "an int64_t")


def _u64(name, value):
    """A pointer, a stream handle or a size: 0 to 2**64 - 1."""
    return _whole(name, value, 0, (1 << 64) - 1, "64 bits")


def _fields(struct, **values):
    """The fields of a ctypes argument struct, each integer checked for its
    C type (int64_t fields signed, pointers and sizes unsigned)."""
    kinds = dict(struct._fields_)
    return {name: _i64(name, value) if kinds[name] is ctypes.c_int64
            else _u64(name, value) for name, value in values.items()}


def _index(op):
    index = op.index if isinstance(op, Op) else op
    return _whole("op", index, 0, (1 << 31) - 1, "a C int")


def _open(function, directory):
    if not isinstance(directory, (str, pathlib.Path)):
        raise InvalidArgumentError(
            f"a bundle folder must be a str or Path, got {directory!r}")
    handle = ctypes.c_void_p()
    _native.runtime_call(function, str(directory).encode(),
                         ctypes.byref(handle))
    return Runtime(handle.value, str(directory))


def load(bundle):
    """Loads a bundle for the calling thread's current GPU (the CUDA primary
    context when none is current): a folder, or a CompiledBundle from
    attnres.compile, loaded from memory. Raises NoDriverError where there is
    no driver, BundleError for a bad bundle."""
    files = getattr(bundle, "files", None)
    if files is None:
        return _open("attnresRuntimeLoad", bundle)
    if len(files) != 1:
        raise InvalidArgumentError(
            f"a bundle loads from memory with one binary, this one has "
            f"{len(files)}: write it to a folder and load that")
    manifest = bundle.manifest_text.encode()
    (binary,) = files.values()
    handle = ctypes.c_void_p()
    _native.runtime_call("attnresRuntimeLoadFromMemory", manifest,
                         len(manifest), binary, len(binary),
                         ctypes.byref(handle))
    return Runtime(handle.value, "<memory>")


def inspect(directory):
    """Parses and checks a bundle folder without a GPU or a driver."""
    return _open("attnresRuntimeInspect", directory)
