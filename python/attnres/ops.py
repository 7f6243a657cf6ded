"""The PyTorch ops: ``attnres.attnres`` and ``attnres.partition_reduce``.

Both are ``torch.library`` custom ops (``attnres::forward``,
``attnres::backward``, ``attnres::merge``, ``attnres::sum``) with fake
implementations and registered autograd, so they trace into
``torch.compile(fullgraph=True)`` graphs and replay under CUDA graphs.

Layout: the kernels read dense row-major ``[N, D]`` sources 16-byte
aligned. A source that is not (a strided view, a transposed or sliced
tensor, an offset view) is **copied** to a dense tensor before the call;
dense sources are read in place, with no copy and no stacking.
"""

import collections
import ctypes
import functools
import operator
import threading

import torch

from . import _checks, _native
from .kernels import folder_for
from .runtime import load

_MIN_TORCH = (2, 4)


def _torch_version():
    parts = []
    for piece in torch.__version__.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _torch_version() < _MIN_TORCH:
    raise ImportError(
        f"attnres's PyTorch ops need PyTorch >= 2.4 (torch.library.custom_op)"
        f", found {torch.__version__}")

# --- kernels per device ----------------------------------------------------

_lock = threading.Lock()
_runtimes = {}


def device_target(device):
    """The compiler target of a torch CUDA/ROCm device: sm_XY or gfxNNN."""
    import os
    if os.environ.get("ATTNRES_TARGET"):
        return os.environ["ATTNRES_TARGET"]
    properties = torch.cuda.get_device_properties(device)
    if getattr(torch.version, "hip", None):
        return properties.gcnArchName.split(":")[0]
    return f"sm_{properties.major}{properties.minor}"


def _runtime(key, device, kernel_options=""):
    index = device.index if device.index is not None else \
        torch.cuda.current_device()
    with _lock:
        runtime = _runtimes.get((key, kernel_options, index))
        if runtime is None:
            folder = folder_for(key, device_target(index), kernel_options)
            # The runtime loads into the thread's current context, which
            # PyTorch's device guard makes the device's primary context.
            with torch.cuda.device(index):
                runtime = load(folder)
            _runtimes[(key, kernel_options, index)] = runtime
        return runtime


def _stream(device):
    return _raw_stream(device.index if device.index is not None else
                       torch.cuda.current_device())


# --- source pointer tables -------------------------------------------------

_TABLES_KEPT = 256
_tables = collections.OrderedDict()
# Tables a CUDA graph reads: a replay may come any time later, so these are
# never evicted (a few bytes each).
_graph_tables = set()


def _raw_stream(index):
    """The driver handle of the current stream of device `index`."""
    return torch.cuda.current_stream(index).cuda_stream


if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    # What TorchInductor's generated code calls: the handle without
    # building a torch.cuda.Stream (a few microseconds per call).
    _raw_stream = torch._C._cuda_getCurrentRawStream  # noqa: F811


def _pointer_table(pointers, device, packed=None):
    """A device int64 array of `pointers` (device addresses). Its contents
    are a function of the key alone, so tables are cached by it: a call
    that repeats its inputs (every training step once the caching allocator
    hands back the same blocks, every CUDA graph replay) copies nothing.
    `packed`, a dense [L, ...] tensor whose rows the pointers are, lets a
    table made during a CUDA graph capture be computed on the device."""
    index = device.index
    key = (index, pointers)
    capturing = torch.cuda.is_current_stream_capturing()
    with _lock:
        cached = _tables.get(key)
        if cached is not None:
            _tables.move_to_end(key)
            if capturing:
                _graph_tables.add(key)
    if cached is not None:
        table, ready, stream = cached
        # The copy that filled the table may be on another stream. (Before
        # a capture, torch.cuda.graph synchronizes the device.)
        if not capturing and stream != _raw_stream(index):
            torch.cuda.current_stream(device).wait_event(ready)
        return table
    if packed is not None:
        # One device addition, no host copy: capturable, and as cheap as a
        # launch where the caching allocator moves a buffer around.
        step = packed.stride(0) * packed.element_size()
        table = torch.add(_row_offsets(len(pointers), step, device),
                          pointers[0])
        if capturing:
            return table
    elif capturing:
        # No host-to-device copy from pageable memory during a capture: the
        # entries are filled by kernels the graph records, so the table is
        # only valid during replays and is not cached for eager calls.
        table = torch.empty(len(pointers), dtype=torch.int64, device=device)
        for entry, pointer in enumerate(pointers):
            table[entry].fill_(pointer)
        return table
    else:
        host = torch.tensor(pointers, dtype=torch.int64).pin_memory()
        table = host.to(device, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(device))
    with _lock:
        _tables[key] = (table, ready, _raw_stream(index))
        for old in list(_tables):
            if len(_tables) <= _TABLES_KEPT:
                break
            if old not in _graph_tables:
                del _tables[old]
    return table


_offsets = {}


def _row_offsets(rows, step, device):
    """[0, step, 2 step, ...] on the device, made once per (rows, step)
    outside captures (a tensor made in one holds data only in replays)."""
    key = (device.index, rows, step)
    offsets = _offsets.get(key)
    if offsets is None:
        offsets = torch.arange(rows, dtype=torch.int64, device=device) * step
        if not torch.cuda.is_current_stream_capturing():
            # Once per shape: later calls may read it from any stream.
            torch.cuda.current_stream(device).synchronize()
            _offsets[key] = offsets
    return offsets


def _packed_pointers(packed):
    """The row addresses of a dense [L, ...] tensor."""
    base = packed.data_ptr()
    step = packed.stride(0) * packed.element_size()
    return tuple(base + row * step for row in range(packed.shape[0]))


def _packed_table(packed):
    return _pointer_table(_packed_pointers(packed), packed.device, packed)


def _dense_and_aligned(tensor):
    return tensor.is_contiguous() and not tensor.data_ptr() & 15


def dense(tensor):
    """The tensor itself when dense and 16-byte aligned, else a copy."""
    if not _dense_and_aligned(tensor):
        copy = torch.empty(tensor.shape, dtype=tensor.dtype,
                           device=tensor.device)
        copy.copy_(tensor)
        return copy
    return tensor


def maybe_dense(tensor):
    return None if tensor is None else dense(tensor)


def _dense_all(sources, query, key_norm, output_norm):
    return ([dense(s) for s in sources], dense(query), maybe_dense(key_norm),
            maybe_dense(output_norm))


def _pointer(tensor):
    return tensor.data_ptr() if tensor is not None and tensor.numel() else 0


_CALLS_KEPT = 1024
_calls = {}


def _signature(tensor):
    return None if tensor is None else (tensor.shape, tensor.dtype,
                                        tensor.device)


def _call(sources, query, key_norm, output_norm, eps, scale, save):
    """The Call of the custom ops' own (already shaped) arguments: checked
    in full the first time a signature (shapes, dtypes, devices, eps, scale,
    save) is seen, then taken from a cache, the sources compared with the
    first one (all must agree)."""
    first = sources[0]
    shape, dtype, device = first.shape, first.dtype, first.device
    alike = all(s.shape == shape and s.dtype == dtype and s.device == device
                for s in sources)
    key = (len(sources), _signature(first), _signature(query),
           _signature(key_norm), _signature(output_norm), eps, scale, save)
    call = _calls.get(key) if alike else None
    if call is None:
        call = _checks.check_attnres(
            sources if len(sources) > 1 or first.dim() == 2 else first,
            query, key_norm, output_norm, eps, scale, save)
        if len(_calls) >= _CALLS_KEPT:
            _calls.clear()
        _calls[key] = call
    return call


def _sources_table(sources):
    if len(sources) == 1 and sources[0].dim() == 3:
        return _packed_table(sources[0])
    return _pointer_table(tuple(s.data_ptr() for s in sources),
                          sources[0].device)


# --- attnres::forward / attnres::backward ----------------------------------
# Inside the custom ops sources are [N, D] each (or one [L, N, D]), the query
# [M, R], output_norm [D] or [M, D]; outputs are [M, N, D] and [M, N].

def _residual_like(reference, call, N, partial=False):
    """The residual of o_pre, [M, N, D/2] int8 where the call keeps one (an
    FP32 partial never does), else an empty tensor."""
    keeps = call.residual and not partial
    shape = (call.M, N, call.D // 2) if keeps else (0,)
    return torch.empty(shape, dtype=torch.int8, device=reference.device)


def forward_impl(sources, query, key_norm, output_norm, eps, scale, save,
                 partial=False):
    """What attnres::forward computes: (o, lse, o_pre, o_pre residual); with
    `partial` what attnres::partial computes (FP32 o, no output norm)."""
    sources, query, key_norm, output_norm = _dense_all(
        sources, query, key_norm, output_norm)
    call = _call(sources, query, key_norm, output_norm, eps, scale, save)
    device = query.device
    M, N, D = call.M, sources[0].shape[-2], call.D
    dtype = torch.float32 if partial else sources[0].dtype
    o = torch.empty((M, N, D), dtype=dtype, device=device)
    lse = torch.empty((M, N), dtype=torch.float32, device=device)
    writes_o_pre = save == "o_pre" and output_norm is not None
    o_pre = torch.empty((M, N, D) if writes_o_pre else (0,), dtype=dtype,
                        device=device)
    residual = _residual_like(query, call, N, partial)
    if N == 0:
        return o, lse, o_pre, residual
    runtime = _runtime(call.spec(partial=partial), device)
    op = runtime.op("forward")
    partitions = runtime.forward_partitions(op, N)
    size = runtime.forward_workspace_size(op, N, partitions)
    workspace = torch.empty(size, dtype=torch.uint8, device=device) \
        if size else None
    table = _sources_table(sources)
    runtime.forward(op, num_tokens=N, sources=table.data_ptr(),
                    query=query.data_ptr(), key_norm=_pointer(key_norm),
                    output_norm=_pointer(output_norm), o=o.data_ptr(),
                    lse=lse.data_ptr(), o_pre=_pointer(o_pre),
                    o_pre_residual=_pointer(residual),
                    partitions=partitions, workspace=_pointer(workspace),
                    workspace_size=size, stream=_stream(device))
    return o, lse, o_pre, residual


@torch.library.custom_op("attnres::forward", mutates_args=())
def forward_op(sources: list[torch.Tensor], query: torch.Tensor,
               key_norm: torch.Tensor | None,
               output_norm: torch.Tensor | None, eps: float, scale: float,
               save: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                   torch.Tensor]:
    return forward_impl(sources, query, key_norm, output_norm, eps, scale,
                        save)


@forward_op.register_fake
def _(sources, query, key_norm, output_norm, eps, scale, save):
    M, N, D = query.shape[0], sources[0].shape[-2], sources[0].shape[-1]
    o = sources[0].new_empty((M, N, D))
    lse = sources[0].new_empty((M, N), dtype=torch.float32)
    writes_o_pre = save == "o_pre" and output_norm is not None
    o_pre = sources[0].new_empty((M, N, D) if writes_o_pre else (0,))
    residual = sources[0].new_empty(
        (M, N, D // 2) if _checks.keeps_residual(sources[0].dtype, D, save)
        else (0,),
        dtype=torch.int8)
    return o, lse, o_pre, residual


def _parameter_grads(query, key_norm, output_norm):
    """Dense dq, dg, dh (empty when the weight is absent), in the real and
    the fake implementation alike: compilers check one against the other."""
    def like(tensor):
        return query.new_empty(tuple(tensor.shape), dtype=tensor.dtype) \
            if tensor is not None else query.new_empty((0,))
    return like(query), like(key_norm), like(output_norm)


def backward_impl(sources, query, key_norm, output_norm, grad, lse, saved,
                  saved_residual, eps, scale, save, fp32_output=False,
                  grad_lse=None, into=None, accumulate=False):
    """What attnres::backward computes: (d sources [L, N, D], dq, dg, dh).
    With `fp32_output` the output gradient and the saved o_pre are FP32 (the
    kernels of Call.spec(fp32_output=True)); with `grad_lse` the backward of
    attnres::partial (Call.spec(partial=True)), given the lse's gradient.
    `into`, a dense [L, N, D] tensor, receives the source gradients (and is
    the first result); with `accumulate` the kernels add them to what it
    holds (Call.spec(accumulate=True)), in place."""
    sources, query, key_norm, output_norm = _dense_all(
        sources, query, key_norm, output_norm)
    grad, lse, saved = dense(grad), dense(lse), maybe_dense(saved)
    saved_residual, grad_lse = maybe_dense(saved_residual), \
        maybe_dense(grad_lse)
    call = _call(sources, query, key_norm, output_norm, eps, scale, save)
    device = query.device
    N, D, L = sources[0].shape[-2], call.D, call.L
    # One [L, N, D] buffer for every source gradient: its table is computed
    # on the device, and a list of sources gets views of it.
    grad_sources = into if into is not None else torch.empty(
        (L, N, D), dtype=sources[0].dtype, device=device)
    dq, dg, dh = _parameter_grads(query, key_norm, output_norm)
    if N == 0:
        dq.zero_()
        dg.zero_()
        dh.zero_()
        if not accumulate:
            grad_sources.zero_()
        return grad_sources, dq, dg, dh
    runtime = _runtime(call.spec(partial=grad_lse is not None,
                                 fp32_output=fp32_output,
                                 accumulate=accumulate), device)
    launch = _BackwardLaunch(runtime, N)
    workspace = torch.empty(launch.workspace, dtype=torch.uint8,
                            device=device)
    table = _sources_table(sources)
    runtime.backward(launch.op, num_tokens=N, sources=table.data_ptr(),
                     query=query.data_ptr(), key_norm=_pointer(key_norm),
                     output_norm=_pointer(output_norm),
                     grad=grad.data_ptr(), lse=lse.data_ptr(),
                     saved=_pointer(saved),
                     saved_residual=_pointer(saved_residual),
                     grad_lse=_pointer(grad_lse),
                     grad_sources=_packed_table(grad_sources).data_ptr(),
                     dq=dq.data_ptr(), dg=_pointer(dg), dh=_pointer(dh),
                     blocks=launch.blocks, partitions=launch.partitions,
                     workspace=workspace.data_ptr(),
                     workspace_size=launch.workspace, stream=_stream(device))
    return grad_sources, dq, dg, dh


@torch.library.custom_op("attnres::backward", mutates_args=())
def backward_op(sources: list[torch.Tensor], query: torch.Tensor,
                key_norm: torch.Tensor | None,
                output_norm: torch.Tensor | None, grad: torch.Tensor,
                lse: torch.Tensor, saved: torch.Tensor | None,
                saved_residual: torch.Tensor | None, eps: float,
                scale: float, save: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor]:
    return backward_impl(sources, query, key_norm, output_norm, grad, lse,
                         saved, saved_residual, eps, scale, save)


@backward_op.register_fake
def _(sources, query, key_norm, output_norm, grad, lse, saved,
      saved_residual, eps, scale, save):
    L = len(sources) if sources[0].dim() == 2 else sources[0].shape[0]
    N, D = sources[0].shape[-2], sources[0].shape[-1]
    grad_sources = sources[0].new_empty((L, N, D))
    dq, dg, dh = _parameter_grads(query, key_norm, output_norm)
    return grad_sources, dq, dg, dh


@torch.library.custom_op("attnres::backward_into",
                         mutates_args=("grad_sources",))
def backward_into_op(sources: list[torch.Tensor], query: torch.Tensor,
                     key_norm: torch.Tensor | None,
                     output_norm: torch.Tensor | None, grad: torch.Tensor,
                     lse: torch.Tensor, saved: torch.Tensor | None,
                     saved_residual: torch.Tensor | None, eps: float,
                     scale: float, save: str, grad_sources: torch.Tensor,
                     accumulate: bool
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attnres::backward writing the source gradients into `grad_sources`
    (a dense [L, N, D] tensor: a residual history's gradient rows), added to
    what it holds where `accumulate`, in the backward kernel (no separate
    add, no per-source tensors); returns (dq, dg, dh)."""
    _checks.check_gradient_buffer(sources, grad_sources)
    if not query.is_cuda:
        return _backward_into_reference(sources, query, key_norm,
                                        output_norm, grad, lse, eps, scale,
                                        grad_sources, accumulate)
    _, dq, dg, dh = backward_impl(sources, query, key_norm, output_norm, grad,
                                  lse, saved, saved_residual, eps, scale,
                                  save, into=grad_sources,
                                  accumulate=accumulate)
    return dq, dg, dh


def _backward_into_reference(sources, query, key_norm, output_norm, grad,
                             lse, eps, scale, grad_sources, accumulate):
    """attnres::backward_into on CPU tensors: the float64 formulas of
    attnres.reference (a residual history traced on the CPU)."""
    from .reference import attnres_backward_reference
    stacked = sources[0] if len(sources) == 1 and sources[0].dim() == 3 \
        else torch.stack(sources)
    dv, dq, dg, dh = attnres_backward_reference(
        stacked, query, grad, key_norm_weight=key_norm,
        output_norm_weight=output_norm, eps=eps, scale=scale, lse=lse)
    dv = dv.reshape(grad_sources.shape)
    if accumulate:
        dv = dv + grad_sources.to(dv.dtype)
    grad_sources.copy_(dv)
    like_dq, like_dg, like_dh = _parameter_grads(query, key_norm, output_norm)
    return (like_dq.copy_(dq), like_dg.copy_(dg) if dg is not None else
            like_dg, like_dh.copy_(dh) if dh is not None else like_dh)


@backward_into_op.register_fake
def _(sources, query, key_norm, output_norm, grad, lse, saved,
      saved_residual, eps, scale, save, grad_sources, accumulate):
    return _parameter_grads(query, key_norm, output_norm)


def _kept(save, output_norm, o, o_pre):
    """What the backward reads besides lse: o_pre (which is o without an
    output norm), or nothing for save="lse"."""
    if save == "lse":
        return None
    return o_pre if output_norm is not None else o


def _gradients(sources, key_norm, output_norm, grads):
    """The backward's (d sources [L, N, D], dq, dg, dh) as the inputs came:
    one gradient of packed sources or one view per source, and None for
    absent weights."""
    grad_sources, dq, dg, dh = grads
    if len(sources) == 1 and sources[0].dim() == 3:
        per_source = (grad_sources,)
    else:
        per_source = tuple(grad_sources.unbind(0))
    return (per_source, dq, dg if key_norm is not None else None,
            dh if output_norm is not None else None)


def _forward_setup(ctx, inputs, output):
    sources, query, key_norm, output_norm, eps, scale, save = inputs
    o, lse, o_pre, residual = output
    saved = _kept(save, output_norm, o, o_pre)
    if not residual.numel():  # no residual (save="lse", f32, odd D)
        residual = None
    ctx.count = len(sources)
    ctx.has = (key_norm is not None, output_norm is not None,
               saved is not None, residual is not None)
    ctx.constants = (eps, scale, save)
    ctx.save_for_backward(*sources, query,
                          *(t for t in (key_norm, output_norm, saved,
                                        residual) if t is not None), lse)


def _forward_saved(ctx):
    """What _forward_setup saved: (sources, query, key_norm, output_norm,
    saved o or o_pre, residual, lse), None where absent."""
    tensors = list(ctx.saved_tensors)
    sources = tensors[:ctx.count]
    rest = tensors[ctx.count:]
    query = rest.pop(0)
    key_norm = rest.pop(0) if ctx.has[0] else None
    output_norm = rest.pop(0) if ctx.has[1] else None
    saved = rest.pop(0) if ctx.has[2] else None
    residual = rest.pop(0) if ctx.has[3] else None
    return sources, query, key_norm, output_norm, saved, residual, rest[0]


def _forward_backward(ctx, grad_o, grad_lse, grad_o_pre, grad_residual):
    sources, query, key_norm, output_norm, saved, residual, lse = \
        _forward_saved(ctx)
    eps, scale, save = ctx.constants
    # The lse, o_pre and residual outputs are saved for the backward, not
    # part of the differentiable interface: attnres.attnres returns o only.
    grads = backward_op(sources, query, key_norm, output_norm,
                        grad_o.to(sources[0].dtype), lse, saved, residual,
                        eps, scale, save)
    per_source, dq, dg, dh = _gradients(sources, key_norm, output_norm, grads)
    return (list(per_source), dq, dg, dh, None, None, None)


forward_op.register_autograd(_forward_backward, setup_context=_forward_setup)


# --- attnres::history_forward: a residual history's read, traced ----------
# A step traced by torch.compile cannot carry the eager history's Python
# bookkeeping (attnres.nn). Its reads form a chain through a carrier tensor
# instead: [C, N, D] in shape and no memory in the forward (zero strides),
# each read's carrier output the next read's input. In the backward the
# carrier's gradient is the history's gradient buffer: each read receives
# it from the read after it (zeros for the last one), adds its sources'
# gradients into its first L rows with the accumulating backward kernel,
# hands it to the read before it, and returns the gradients of the rows
# appended since that read (`first_pending` on): copies of their rows,
# which hold every later read's contribution by then. CPU tensors take the
# float64 formulas of attnres.reference, with the same chain.

def _carrier_like(carrier):
    return carrier.new_zeros(()).expand(carrier.shape)


@torch.library.custom_op("attnres::history_forward", mutates_args=())
def history_forward_op(sources: list[torch.Tensor], carrier: torch.Tensor,
                       query: torch.Tensor, key_norm: torch.Tensor | None,
                       output_norm: torch.Tensor | None, eps: float,
                       scale: float, save: str, first_pending: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor, torch.Tensor]:
    if query.is_cuda:
        o, lse, o_pre, residual = forward_impl(
            sources, query, key_norm, output_norm, eps, scale, save)
    else:
        from .reference import attnres_reference
        o, lse = attnres_reference(torch.stack(sources), query,
                                   key_norm_weight=key_norm,
                                   output_norm_weight=output_norm, eps=eps,
                                   scale=scale, return_lse=True)
        o = o.to(sources[0].dtype).contiguous()
        lse = lse.float().contiguous()
        o_pre = query.new_empty((0,), dtype=sources[0].dtype)
        residual = query.new_empty((0,), dtype=torch.int8)
    return o, lse, o_pre, residual, _carrier_like(carrier)


@history_forward_op.register_fake
def _(sources, carrier, query, key_norm, output_norm, eps, scale, save,
      first_pending):
    M, N, D = query.shape[0], sources[0].shape[-2], sources[0].shape[-1]
    o = sources[0].new_empty((M, N, D))
    lse = sources[0].new_empty((M, N), dtype=torch.float32)
    on_cuda = query.device.type == "cuda"
    writes_o_pre = on_cuda and save == "o_pre" and output_norm is not None
    o_pre = sources[0].new_empty((M, N, D) if writes_o_pre else (0,))
    keeps = on_cuda and _checks.keeps_residual(sources[0].dtype, D, save)
    residual = sources[0].new_empty((M, N, D // 2) if keeps else (0,),
                                    dtype=torch.int8)
    return o, lse, o_pre, residual, _carrier_like(carrier)


def _history_setup(ctx, inputs, output):
    (sources, carrier, query, key_norm, output_norm, eps, scale, save,
     first_pending) = inputs
    o, lse, o_pre, residual, _ = output
    _forward_setup(ctx, (sources, query, key_norm, output_norm, eps, scale,
                         save), (o, lse, o_pre, residual))
    ctx.carrier_shape = tuple(carrier.shape)
    ctx.first_pending = first_pending


def _history_backward(ctx, grad_o, grad_lse, grad_o_pre, grad_residual,
                      grad_carrier):
    sources, query, key_norm, output_norm, saved, residual, lse = \
        _forward_saved(ctx)
    eps, scale, save = ctx.constants
    count, dtype = ctx.count, sources[0].dtype
    # The buffer the later reads added into, or zeros after the last read
    # (a materialized gradient of the zero-strided carrier is made dense).
    buffer = grad_carrier.contiguous() if grad_carrier is not None else \
        sources[0].new_zeros(ctx.carrier_shape)
    if grad_o is None:
        grad_o = torch.zeros((query.shape[0],) + tuple(sources[0].shape),
                             dtype=dtype, device=query.device)
    dq, dg, dh = backward_into_op(
        sources, query, key_norm, output_norm, grad_o.to(dtype), lse, saved,
        residual, eps, scale, save, buffer[:count], True)
    dg = dg if key_norm is not None else None
    dh = dh if output_norm is not None else None
    rows = [None] * ctx.first_pending + [
        buffer[row].clone() for row in range(ctx.first_pending, count)]
    return (rows, buffer, dq, dg, dh, None, None, None, None)


history_forward_op.register_autograd(_history_backward,
                                     setup_context=_history_setup)


# --- attnres::partial / attnres::partial_backward --------------------------
# The partial result over a group of sources: o [M, N, D] in FP32 before any
# output norm, and its lse [M, N]; its backward takes the gradients of both
# (docs/Math.md: ds_s = scale * p_s * (<do, v_s> - delta + dlse)).

def partial_impl(sources, query, key_norm, eps, scale):
    """What attnres::partial computes: (o [M, N, D] FP32, lse [M, N])."""
    return forward_impl(sources, query, key_norm, None, eps, scale, "o_pre",
                        partial=True)[:2]


@torch.library.custom_op("attnres::partial", mutates_args=())
def partial_op(sources: list[torch.Tensor], query: torch.Tensor,
               key_norm: torch.Tensor | None, eps: float, scale: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    return partial_impl(sources, query, key_norm, eps, scale)


@partial_op.register_fake
def _(sources, query, key_norm, eps, scale):
    M, N, D = query.shape[0], sources[0].shape[-2], sources[0].shape[-1]
    return (sources[0].new_empty((M, N, D), dtype=torch.float32),
            sources[0].new_empty((M, N), dtype=torch.float32))


def partial_backward_impl(sources, query, key_norm, grad_o, grad_lse, lse, o,
                          eps, scale):
    """(d sources [L, N, D], dq, dg) of attnres::partial."""
    return backward_impl(sources, query, key_norm, None, grad_o, lse, o, None,
                         eps, scale, "o_pre", grad_lse=grad_lse)[:3]


@torch.library.custom_op("attnres::partial_backward", mutates_args=())
def partial_backward_op(sources: list[torch.Tensor], query: torch.Tensor,
                        key_norm: torch.Tensor | None, grad_o: torch.Tensor,
                        grad_lse: torch.Tensor, lse: torch.Tensor,
                        o: torch.Tensor, eps: float, scale: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return partial_backward_impl(sources, query, key_norm, grad_o, grad_lse,
                                 lse, o, eps, scale)


@partial_backward_op.register_fake
def _(sources, query, key_norm, grad_o, grad_lse, lse, o, eps, scale):
    L = len(sources) if sources[0].dim() == 2 else sources[0].shape[0]
    N, D = sources[0].shape[-2], sources[0].shape[-1]
    dq, dg, _ = _parameter_grads(query, key_norm, None)
    return sources[0].new_empty((L, N, D)), dq, dg


@torch.library.custom_op("attnres::partial_backward_into",
                         mutates_args=("grad_sources",))
def partial_backward_into_op(sources: list[torch.Tensor],
                             query: torch.Tensor,
                             key_norm: torch.Tensor | None,
                             grad_o: torch.Tensor, grad_lse: torch.Tensor,
                             lse: torch.Tensor, o: torch.Tensor, eps: float,
                             scale: float, grad_sources: torch.Tensor,
                             accumulate: bool
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """attnres::partial_backward writing the source gradients into
    `grad_sources` ([L, N, D], dense), added to what it holds where
    `accumulate`; returns (dq, dg)."""
    _checks.check_gradient_buffer(sources, grad_sources)
    _, dq, dg, _ = backward_impl(sources, query, key_norm, None, grad_o, lse,
                                 o, None, eps, scale, "o_pre",
                                 grad_lse=grad_lse, into=grad_sources,
                                 accumulate=accumulate)
    return dq, dg


@partial_backward_into_op.register_fake
def _(sources, query, key_norm, grad_o, grad_lse, lse, o, eps, scale,
      grad_sources, accumulate):
    dq, dg, _ = _parameter_grads(query, key_norm, None)
    return dq, dg


def _partial_setup(ctx, inputs, output):
    sources, query, key_norm, eps, scale = inputs
    o, lse = output
    ctx.count = len(sources)
    ctx.has_key_norm = key_norm is not None
    ctx.constants = (eps, scale)
    ctx.save_for_backward(*sources, query,
                          *((key_norm,) if key_norm is not None else ()),
                          o, lse)


def _partial_backward(ctx, grad_o, grad_lse):
    tensors = list(ctx.saved_tensors)
    sources = tensors[:ctx.count]
    rest = tensors[ctx.count:]
    query = rest.pop(0)
    key_norm = rest.pop(0) if ctx.has_key_norm else None
    o, lse = rest
    # A result that did not reach the loss has no gradient: zeros.
    grad_o = torch.zeros_like(o) if grad_o is None else grad_o.float()
    grad_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse.float()
    grad_sources, dq, dg = partial_backward_op(
        sources, query, key_norm, grad_o, grad_lse, lse, o, *ctx.constants)
    per_source, dq, dg, _ = _gradients(sources, key_norm, None,
                                       (grad_sources, dq, dg, None))
    return list(per_source), dq, dg, None, None


partial_op.register_autograd(_partial_backward, setup_context=_partial_setup)


# --- the eager path --------------------------------------------------------
# An eager call need not go through the dispatcher, nor be checked in full
# every time: the first call of a signature (the shapes, dtypes and devices
# of every tensor, eps, scale, save) is checked as always and leaves a
# _Plan with everything the launches need; later calls with that signature
# only compare it, then allocate, launch and hand autograd one Function.
# Traced calls (torch.compile, export, fake tensors) use the custom ops
# above, and so do inputs the kernels cannot read in place (they are copied
# there). docs/Performance.md has the host times.

_plans = {}
_PLANS_KEPT = 1024
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_dtype_of = operator.attrgetter("dtype")


class _BackwardLaunch:
    """A bundle's backward op sized for N tokens: the handle, op, block
    and partition counts and workspace bytes its launches pass."""

    def __init__(self, runtime, N):
        op = runtime.op("backward")
        self.runtime = runtime  # keeps the handle's bundle loaded
        self.handle, self.op = runtime._handle, op.index
        # Whether the kernel leaves the rows of null gradient entries alone
        # (bundles from before that fact store through every entry).
        self.skips_null_gradients = bool(op.get("skips_null_gradients"))
        # Whether an entry tagged in bit 0 (its row's address plus one) is
        # written over by an accumulating launch instead of added to (older
        # bundles would store at the odd address).
        self.writes_tagged_gradients = bool(op.get("writes_tagged_gradients"))
        self.blocks = runtime.backward_blocks(op, N)
        self.partitions = runtime.backward_partitions(op, self.blocks)
        self.workspace = runtime.backward_workspace_size(
            op, N, self.blocks, self.partitions)
        self.workspaces = {}   # (_workspace)


class _Plan:
    """An eager call's launches for one signature (of a bundle compiled
    with `kernel_options`)."""

    def __init__(self, call, device, kernel_options=""):
        runtime = _runtime(call.spec(), device, kernel_options)
        forward = runtime.op("forward")
        N, M, D = call.N, call.M, call.D
        self.handle = runtime._handle
        self.runtime = runtime  # keeps the handle's bundle loaded
        self.forward_op = forward.index
        self.partitions = runtime.forward_partitions(forward, N)
        self.forward_workspace = runtime.forward_workspace_size(
            forward, N, self.partitions)
        self.forward_workspaces = {}   # (_workspace)
        self.backward = _BackwardLaunch(runtime, N)
        self.num_tokens = N
        self.packed = call.packed
        self.device = device
        self.index = device.index
        self.out_shape = ((M,) if call.multi_query else ()) + call.lead + (D,)
        self.lse_shape = (M, N)
        self.writes_o_pre = call.save == "o_pre" and call.output_norm
        self.keeps_o = call.save == "o_pre" and not call.output_norm
        self.residual_shape = (M, N, D // 2) if call.residual else None
        self.grad_shape = (call.L,) + call.lead + (D,)


def _weight_signature(tensor):
    if tensor is None:
        return None
    if type(tensor) not in _TENSOR_TYPES or not _dense_and_aligned(tensor):
        return False
    return (tensor.shape, tensor.dtype, tensor.get_device())


def _eager_key(sources, query, key_norm, output_norm, eps, scale, save):
    """The signature of an eager call and its sources' addresses, or None
    where the call must take the full path."""
    if type(query) not in _TENSOR_TYPES or not query.is_cuda or \
            not _dense_and_aligned(query):
        return None
    if type(sources) in _TENSOR_TYPES:
        if not _dense_and_aligned(sources) or sources.dim() < 3:
            return None
        pointers = _packed_pointers(sources)
        head = ("packed", sources.shape, sources.dtype, sources.get_device())
    elif type(sources) in (list, tuple) and sources:
        # Each attribute over all sources at once: these loops run in C.
        if len(set(map(type, sources)) - set(_TENSOR_TYPES)) or \
                len(set(map(torch.Tensor.size, sources))) != 1 or \
                len(set(map(_dtype_of, sources))) != 1 or \
                len(set(map(torch.Tensor.get_device, sources))) != 1 or \
                not all(map(torch.Tensor.is_contiguous, sources)):
            return None
        pointers = tuple(map(torch.Tensor.data_ptr, sources))
        if functools.reduce(operator.or_, pointers) & 15:
            return None
        first = sources[0]
        head = (len(sources), first.shape, first.dtype, first.get_device())
    else:
        return None
    weights = (_weight_signature(key_norm), _weight_signature(output_norm))
    if False in weights:
        return None
    # The types too: eps=True is refused where eps=1 is not.
    key = head + (query.shape, query.dtype, query.get_device()) + weights + \
        (type(eps), eps, type(scale), scale, save)
    return key, pointers


def _plan_for(key, sources, query, key_norm, output_norm, eps, scale, save):
    plan = _plans.get(key)
    if plan is None:
        call = _checks.check_attnres(sources, query, key_norm, output_norm,
                                     eps, scale, save)
        # No tokens: the full path returns the empty results.
        plan = _Plan(call, query.device) if call.N else False
        if len(_plans) >= _PLANS_KEPT:
            _plans.clear()
        _plans[key] = plan
    return plan


def _check(status, error):
    if status:
        _native.check_status(status, error,
                             _native.runtime_lib().attnresFreeString)


def _launch_forward(plan, pointers, sources, query, key_norm, output_norm):
    table = _pointer_table(pointers, plan.device,
                           sources if plan.packed else None)
    dtype = sources.dtype if plan.packed else sources[0].dtype
    return _launch_forward_from(plan, table, dtype, query, key_norm,
                                output_norm) + (table,)


# Workspaces up to this size are kept, one per launch and stream: the
# eager calls where host time counts are the small ones, and an empty CUDA
# tensor costs several microseconds of it.
_WORKSPACE_KEPT_BYTES = 1 << 20


def _workspace(kept, size, device):
    """A workspace of `size` bytes for launches on the current stream, or
    None for none. Kept ones (in `kept`, by stream) are reused: a launch's
    kernels use theirs only while they run, and the next launch on the same
    stream runs after them. A CUDA graph capture gets a workspace of its
    own (its replays may overlap eager launches)."""
    if not size:
        return None
    if size > _WORKSPACE_KEPT_BYTES or \
            torch.cuda.is_current_stream_capturing():
        return torch.empty(size, dtype=torch.uint8, device=device)
    stream = _raw_stream(device.index)
    workspace = kept.get(stream)
    if workspace is None:
        workspace = kept[stream] = torch.empty(size, dtype=torch.uint8,
                                               device=device)
    return workspace


def _launch_forward_from(plan, table, dtype, query, key_norm, output_norm):
    """The forward of `plan` reading the sources' rows through `table` (a
    device table of their addresses): (o, lse, o_pre, residual)."""
    device = plan.device
    o = torch.empty(plan.out_shape, dtype=dtype, device=device)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=device)
    o_pre = torch.empty(plan.out_shape, dtype=dtype, device=device) \
        if plan.writes_o_pre else None
    residual = torch.empty(plan.residual_shape, dtype=torch.int8,
                           device=device) if plan.residual_shape else None
    workspace = _workspace(plan.forward_workspaces, plan.forward_workspace,
                           device)
    args = _native.ForwardArgs(
        plan.num_tokens, table.data_ptr(), query.data_ptr(),
        _pointer(key_norm), _pointer(output_norm), o.data_ptr(),
        lse.data_ptr(), _pointer(o_pre), plan.partitions,
        _pointer(workspace), plan.forward_workspace, _pointer(residual))
    error = ctypes.c_void_p()
    _check(_native.runtime_lib().attnresForward(
        plan.handle, plan.forward_op, ctypes.byref(args),
        _raw_stream(plan.index), ctypes.byref(error)), error)
    return o, lse, o_pre, residual


def _launch_backward_into(plan, launch, table, grad_table, dtype, query,
                          key_norm, output_norm, grad, lse, saved, residual):
    """The backward `launch` (plan.backward, or the accumulating bundle's
    of the same call) reading the sources through `table` and writing, or
    adding, their gradients through `grad_table` (device tables of row
    addresses); the output gradient is taken in the sources' `dtype`.
    Returns (dq, dg, dh)."""
    device = plan.device
    if grad.dtype is not dtype:
        grad = grad.to(dtype)
    grad = dense(grad)
    dq = torch.empty(query.shape, dtype=query.dtype, device=device)
    dg = torch.empty(key_norm.shape, dtype=key_norm.dtype, device=device) \
        if key_norm is not None else None
    dh = torch.empty(output_norm.shape, dtype=output_norm.dtype,
                     device=device) if output_norm is not None else None
    workspace = _workspace(launch.workspaces, launch.workspace, device)
    args = _native.BackwardArgs(
        plan.num_tokens, table.data_ptr(), query.data_ptr(),
        _pointer(key_norm), _pointer(output_norm), grad.data_ptr(),
        lse.data_ptr(), _pointer(saved), grad_table.data_ptr(),
        dq.data_ptr(), _pointer(dg), _pointer(dh), launch.blocks,
        launch.partitions, _pointer(workspace), launch.workspace,
        _pointer(residual))
    error = ctypes.c_void_p()
    _check(_native.runtime_lib().attnresBackward(
        launch.handle, launch.op, ctypes.byref(args),
        _raw_stream(plan.index), ctypes.byref(error)), error)
    return dq, dg, dh


def _launch_backward(plan, table, sources, query, key_norm, output_norm,
                     grad, lse, saved, residual, wanted=None):
    """The backward of an eager call: (the sources' gradients, dq, dg,
    dh). `wanted` (one bool a source input: a packed source is one) leaves
    out the gradients of the sources it marks False: their entries in the
    table of gradient rows are null, which the kernel neither reads nor
    writes, and their gradients are None. (With a bundle whose kernel
    does not skip null entries, every gradient is computed and those are
    dropped.)"""
    dtype = sources[0].dtype
    if wanted is not None and not plan.backward.skips_null_gradients:
        per_source, dq, dg, dh = _launch_backward(
            plan, table, sources, query, key_norm, output_norm, grad, lse,
            saved, residual)
        return (tuple(g if w else None for g, w in zip(per_source, wanted)),
                dq, dg, dh)
    if plan.packed and wanted is not None and not wanted[0]:
        grad_table = _pointer_table((0,) * plan.grad_shape[0], plan.device)
        per_source = (None,)
    elif wanted is None or all(wanted):
        grad_sources = torch.empty(plan.grad_shape, dtype=dtype,
                                   device=plan.device)
        grad_table = _pointer_table(_packed_pointers(grad_sources),
                                    plan.device, grad_sources)
        per_source = (grad_sources,) if plan.packed else \
            grad_sources.unbind(0)
    else:
        grad_sources = torch.empty((sum(wanted),) + plan.grad_shape[1:],
                                   dtype=dtype, device=plan.device)
        rows = iter(grad_sources.unbind(0))
        per_source = [next(rows) if w else None for w in wanted]
        grad_table = _pointer_table(
            tuple(g.data_ptr() if g is not None else 0 for g in per_source),
            plan.device)
    dq, dg, dh = _launch_backward_into(
        plan, plan.backward, table, grad_table, dtype, query, key_norm,
        output_norm, grad, lse, saved, residual)
    return per_source, dq, dg, dh


class _Eager(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, pointers, query, key_norm, output_norm,
                *sources):
        packed = sources[0] if plan.packed else sources
        o, lse, o_pre, residual, table = _launch_forward(
            plan, pointers, packed, query, key_norm, output_norm)
        ctx.plan, ctx.table = plan, table
        saved = o if plan.keeps_o else o_pre
        ctx.save_for_backward(query, key_norm, output_norm, saved, residual,
                              lse, *sources)
        return o

    @staticmethod
    def backward(ctx, grad_o):
        # Unpacking checks that no saved tensor was modified in place.
        query, key_norm, output_norm, saved, residual, lse, *sources = \
            ctx.saved_tensors
        wanted = ctx.needs_input_grad[5:]
        per_source, dq, dg, dh = _launch_backward(
            ctx.plan, ctx.table, sources, query, key_norm, output_norm,
            grad_o, lse, saved, residual, wanted)
        return (None, None, dq, dg, dh, *per_source)


def attnres_eager(sources, query, key_norm, output_norm, eps, scale, save):
    """o of an eager CUDA call of attnres.attnres (the user's arguments, as
    they came), or None where the call must take the full path: traced,
    inputs the kernels cannot read in place, no tokens. Raises the checks'
    errors for a bad call."""
    if torch.compiler.is_compiling() or \
            torch._C._get_tracing_state() is not None:
        return None
    found = _eager_key(sources, query, key_norm, output_norm, eps, scale,
                       save)
    if found is None:
        return None
    key, pointers = found
    plan = _plan_for(key, sources, query, key_norm, output_norm, eps, scale,
                     save)
    if not plan:
        return None
    tensors = (sources,) if plan.packed else sources
    if torch.is_grad_enabled():
        return _Eager.apply(plan, pointers, query, key_norm, output_norm,
                            *tensors)
    return _launch_forward(plan, pointers, sources, query, key_norm,
                           output_norm)[0]


# --- attnres::merge / attnres::sum -----------------------------------------

def _merge_key(P, D, out, sink, output_norm, eps):
    key = f"merge:P={P},D={D},out={out}"
    if sink:
        key += ",sink"
    if output_norm:
        key += f",output_norm,eps={eps!r}"
    return key


def merge_impl(partials, lse, sink, output_norm, eps):
    """What attnres::merge computes, with the merged o_pre the kernel also
    writes where there is an output norm (else None): (o, lse, o_pre)."""
    partials, lse = dense(partials), dense(lse)
    sink, output_norm = maybe_dense(sink), maybe_dense(output_norm)
    P, rows, D = partials.shape
    dtype = output_norm.dtype if output_norm is not None else torch.float32
    o = torch.empty((rows, D), dtype=dtype, device=partials.device)
    merged_lse = torch.empty((rows,), dtype=torch.float32,
                             device=partials.device)
    o_pre = torch.empty_like(o) if output_norm is not None else None
    if rows == 0:
        return o, merged_lse, o_pre
    out = _checks.VALUE_TYPES[str(dtype)]
    runtime = _runtime(_merge_key(P, D, out, sink is not None,
                                  output_norm is not None, eps),
                       partials.device)
    runtime.merge(runtime.op("partition_reduce_softmax"), num_rows=rows,
                  partials=partials.data_ptr(), partial_lse=lse.data_ptr(),
                  sink=_pointer(sink), output_norm=_pointer(output_norm),
                  o=o.data_ptr(), lse=merged_lse.data_ptr(),
                  o_pre=_pointer(o_pre), rows_per_weight=rows,
                  stream=_stream(partials.device))
    return o, merged_lse, o_pre


@torch.library.custom_op("attnres::merge", mutates_args=())
def merge_op(partials: torch.Tensor, lse: torch.Tensor,
             sink: torch.Tensor | None, output_norm: torch.Tensor | None,
             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return merge_impl(partials, lse, sink, output_norm, eps)[:2]


def merge_normalized_impl(partials, lse, output_norm, eps):
    """The softmax merge with the output norm fused, for callers that keep
    the merged rows for a backward: (o, lse, o_pre), o and o_pre FP32
    (output_norm [D] is read in FP32). Not traced: attnres.distributed's
    autograd Function calls it."""
    return merge_impl(partials, lse, None, output_norm.float(), eps)


@merge_op.register_fake
def _(partials, lse, sink, output_norm, eps):
    P, rows, D = partials.shape
    dtype = output_norm.dtype if output_norm is not None else torch.float32
    return (partials.new_empty((rows, D), dtype=dtype),
            partials.new_empty((rows,)))


def _merge_setup(ctx, inputs, output):
    partials, lse, sink, output_norm, eps = inputs
    ctx.has = (sink is not None, output_norm is not None)
    ctx.eps = eps
    ctx.save_for_backward(partials, lse, output[1],
                          *(t for t in (sink, output_norm) if t is not None))


def _merge_backward(ctx, grad_o, grad_lse):
    partials, lse, merged_lse, *rest = ctx.saved_tensors
    sink = rest.pop(0) if ctx.has[0] else None
    output_norm = rest.pop(0) if ctx.has[1] else None
    # The weights of the merge, exactly zero for empty partitions (lse_p =
    # -inf, whatever their rows hold) and when every partition is empty.
    empty = torch.isneginf(lse)
    weights = torch.where(empty, 0.0, torch.exp(lse - merged_lse))
    values = torch.where(empty.unsqueeze(-1), 0.0, partials)
    o_pre = (weights.unsqueeze(-1) * values).sum(0)
    grad = grad_o.float() if grad_o is not None else torch.zeros_like(o_pre)
    grad_h = None
    if output_norm is not None:
        rho = torch.rsqrt(o_pre.square().mean(-1, keepdim=True) + ctx.eps)
        xhat = o_pre * rho
        weighted = grad * output_norm.float()
        grad_h = (xhat * grad).sum(0).to(output_norm.dtype)
        grad = rho * (weighted -
                      xhat * (xhat * weighted).mean(-1, keepdim=True))
    centre = (grad * o_pre).sum(-1)
    grad_partials = weights.unsqueeze(-1) * grad
    grad_lse_p = weights * ((values * grad).sum(-1) - centre)
    if grad_lse is not None:
        grad_lse_p = grad_lse_p + weights * grad_lse
    grad_sink = None
    if sink is not None:
        sink_weight = torch.where(torch.isneginf(sink), 0.0,
                                  torch.exp(sink - merged_lse))
        sink_weight = torch.nan_to_num(sink_weight, nan=1.0)
        grad_sink = sink_weight * (-centre)
        if grad_lse is not None:
            grad_sink = grad_sink + sink_weight * grad_lse
    return grad_partials, grad_lse_p, grad_sink, grad_h, None


merge_op.register_autograd(_merge_backward, setup_context=_merge_setup)


@torch.library.custom_op("attnres::sum", mutates_args=())
def sum_op(partials: torch.Tensor) -> torch.Tensor:
    partials = dense(partials)
    P, count = partials.shape
    output = torch.empty((count,), dtype=torch.float32,
                         device=partials.device)
    if count == 0:
        return output
    runtime = _runtime(f"sum:P={P}", partials.device)
    runtime.sum(runtime.op("partition_reduce_sum"),
                partials=partials.data_ptr(), output=output.data_ptr(),
                num_elements=count, stream=_stream(partials.device))
    return output


@sum_op.register_fake
def _(partials):
    return partials.new_empty((partials.shape[1],))


def _sum_setup(ctx, inputs, output):
    ctx.count = inputs[0].shape[0]


def _sum_backward(ctx, grad):
    return grad.unsqueeze(0).expand(ctx.count, -1)


sum_op.register_autograd(_sum_backward, setup_context=_sum_setup)
