"""A residual history for models: every layer output in one buffer, read by
AttnRes without copies, its gradients accumulated in place.

In a Full AttnRes stack layer i reads the embedding and every earlier
layer's output. With :func:`attnres.attnres` each output is its own
autograd input: a source read by k later layers gets k gradient tensors
that autograd adds with k - 1 extra kernels, and every call pays host time
per source. :class:`ResidualHistory` keeps the outputs as the rows of one
preallocated ``[capacity, ..., D]`` buffer and their gradients as the rows
of a second one: layer i's AttnRes reads rows ``[0, i)`` as packed sources
(a view), and its backward kernel adds each row's gradient into the
gradient buffer in place (the ``accumulate`` form of the backward op: a
read-modify-write of the row, no separate add). Each appended output gets
its gradient back as a view of that buffer, once every later reader has
added into it (autograd orders this through a chain of empty tensors, one
per append). Megatron-LM's weight-gradient accumulation fusion is the
precedent.

    history = attnres.nn.ResidualHistory(capacity=len(layers) + 1)
    history.start(embedding)
    for layer in layers:
        x = history.attend(layer.query, key_norm_weight=layer.key_norm,
                           output_norm_weight=layer.pre_norm)
        history.append(layer(x))
    out = history.attend(final_query)

CUDA tensors run the compiled kernels (PyTorch >= 2.4); CPU tensors the
float64 formulas of :mod:`attnres.reference`, with the same buffers and the
same autograd structure (for tests, and devices the compiler does not
target).
"""

import torch

from .errors import InvalidArgumentError


class HistoryError(InvalidArgumentError):
    """A residual history used against its rules (capacity, shapes, a
    backward through a history that was started again or ran already)."""


class ResidualHistory:
    """Layer outputs of one step in one buffer, for AttnRes.

    ``capacity`` rows at most: the first output (:meth:`start`) and each
    one :meth:`append`\\ ed after it. The buffers are allocated by the first
    :meth:`start` of a shape, dtype and device and reused by later ones (so
    that a captured CUDA graph replays on the same addresses); a
    :meth:`start` of another shape allocates again.
    """

    def __init__(self, capacity):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or \
                capacity < 1:
            raise HistoryError(
                f"capacity must be an int >= 1 (rows of the history), got "
                f"{capacity!r}")
        self.capacity = capacity
        self._rows = None       # [capacity, *shape], the outputs
        self._grads = None      # [capacity, *shape], their gradients
        self._count = 0
        self._step = 0          # started steps: a graph belongs to one
        self._token = None
        self._written = 0       # gradient rows written this backward
        self._backwards = set()  # reads whose backward ran this step
        self._reads = 0

    # --- the step --------------------------------------------------------

    def start(self, first):
        """Starts a step: `first` ([..., D], bf16, f16 or f32; the
        embedding) is row 0. Graphs built on the previous step can no longer
        run their backward."""
        if not isinstance(first, torch.Tensor):
            raise HistoryError(
                f"start takes a tensor [..., D], got {type(first).__name__}")
        if first.dim() < 2 or first.numel() == 0:
            raise HistoryError(
                f"start takes a non-empty tensor [..., D] with at least one "
                f"token dimension, got shape {list(first.shape)}")
        if first.dtype not in (torch.bfloat16, torch.float16,
                               torch.float32):
            raise HistoryError(
                f"a history holds bf16, f16 or f32 rows, got {first.dtype}")
        shape = (self.capacity,) + tuple(first.shape)
        if self._rows is None or tuple(self._rows.shape) != shape or \
                self._rows.dtype != first.dtype or \
                self._rows.device != first.device:
            self._rows = torch.empty(shape, dtype=first.dtype,
                                     device=first.device)
            self._grads = torch.empty_like(self._rows)
        self._step += 1
        self._count = 0
        self._written = 0
        self._backwards = set()
        self._reads = 0
        self._token = torch.empty(0, device=first.device, requires_grad=True)
        self._append(first)

    def append(self, output):
        """Appends a layer's output ([..., D], the shape, dtype and device
        of the first row) as the next row. Its gradient from the history's
        readers comes back to it as a view of the gradient buffer."""
        if self._rows is None:
            raise HistoryError("append before start: the first row (the "
                               "embedding) starts a step")
        self._append(output)

    def _append(self, output):
        if not isinstance(output, torch.Tensor):
            raise HistoryError(
                f"append takes a tensor, got {type(output).__name__}")
        row_shape = tuple(self._rows.shape[1:])
        if tuple(output.shape) != row_shape or \
                output.dtype != self._rows.dtype or \
                output.device != self._rows.device:
            raise HistoryError(
                f"row {self._count} must be a {list(row_shape)} "
                f"{self._rows.dtype} tensor on {self._rows.device} (as the "
                f"first row), got {list(output.shape)} {output.dtype} on "
                f"{output.device}")
        if self._count >= self.capacity:
            raise HistoryError(
                f"append past the capacity: the history holds "
                f"{self.capacity} rows (the first and {self.capacity - 1} "
                f"appended)")
        self._token = _Append.apply(output, self._token, self, self._count)
        self._count += 1

    def __len__(self):
        return self._count

    @property
    def rows(self):
        """The rows so far, ``[len(self), ..., D]`` (a view, not for
        writing)."""
        if self._rows is None:
            raise HistoryError("the history has not started")
        return self._rows[:self._count]

    # --- reading ---------------------------------------------------------

    def attend(self, query, *, key_norm_weight=None, output_norm_weight=None,
               eps=1e-6, scale=1.0, save="o_pre"):
        """AttnRes over every row so far (the arguments of
        :func:`attnres.attnres`, the sources being the rows): ``[..., D]``,
        or ``[M, ..., D]`` for a 2-D query."""
        if self._rows is None or self._count == 0:
            raise HistoryError("attend before start: the history has no rows")
        count = getattr(self, "_pinned_count", None) or self._count
        from . import _checks
        call = _checks.check_attnres(self._rows[:count], query,
                                     key_norm_weight, output_norm_weight,
                                     eps, scale, save, any_device=True)
        read = self._reads
        self._reads += 1
        return _Attend.apply(self._token, query, key_norm_weight,
                             output_norm_weight, self, count, call, read,
                             eps, scale, save)

    def checkpoint(self, function, *args, **kwargs):
        """``torch.utils.checkpoint.checkpoint(function, *args, **kwargs)``
        (non-reentrant) for a function that reads this history: its
        recomputation in the backward reads the rows the first run read,
        not those appended since."""
        from torch.utils.checkpoint import checkpoint
        count = self._count

        def pinned(*inner_args, **inner_kwargs):
            previous = getattr(self, "_pinned_count", None)
            self._pinned_count = count
            try:
                return function(*inner_args, **inner_kwargs)
            finally:
                self._pinned_count = previous

        return checkpoint(pinned, *args, use_reentrant=False, **kwargs)

    # --- backward bookkeeping ---------------------------------------------

    def _check_step(self, step, what):
        if step != self._step:
            raise HistoryError(
                f"{what} of a residual history's step {step} after step "
                f"{self._step} started: its rows were overwritten (keep one "
                f"history per step in flight, or run the backward before "
                f"the next start)")

    def _gradient_rows(self, count):
        """The gradient rows [0, count) and whether the backward adds into
        them: rows some later reader's backward wrote already are added to,
        the others written (the first backward, the last reader's, writes
        every row it reads)."""
        if self._written >= count:
            return self._grads[:count], True
        if self._written > 0:
            # A reader of more rows than every one whose backward ran
            # (reads out of order): the new rows start from zero.
            self._grads[self._written:count].zero_()
            self._written = count
            return self._grads[:count], True
        self._written = count
        return self._grads[:count], False


def _check_read_once(history, step, read):
    history._check_step(step, "a backward")
    if read in history._backwards:
        raise HistoryError(
            "a second backward through a residual history's read: its "
            "gradients were added into the history once already (run the "
            "step again, or keep the graph's gradients with another "
            "history)")
    history._backwards.add(read)


class _Append(torch.autograd.Function):
    """Writes an output into its row; its backward returns the row's
    gradient, which every later reader (ordered before it by the token
    chain) has added into."""

    @staticmethod
    def forward(ctx, output, token, history, row):
        history._rows[row].copy_(output)
        ctx.history, ctx.row, ctx.step = history, row, history._step
        return token.new_empty(0)

    @staticmethod
    def backward(ctx, grad_token):
        history = ctx.history
        history._check_step(ctx.step, "a backward")
        grad = None
        if history._written > ctx.row:
            grad = history._grads[ctx.row]
        return grad, grad_token.new_empty(0), None, None


class _Attend(torch.autograd.Function):
    """AttnRes over the history's first `count` rows (packed sources: a
    view); its backward adds the rows' gradients into the history's
    gradient buffer in the backward kernel."""

    @staticmethod
    def forward(ctx, token, query, key_norm, output_norm, history, count,
                call, read, eps, scale, save):
        rows = history._rows[:count]
        o, saved = _forward(rows, call, query, key_norm, output_norm, eps,
                            scale, save)
        ctx.history, ctx.count, ctx.call = history, count, call
        ctx.step, ctx.read = history._step, read
        ctx.constants = (eps, scale, save)
        ctx.has = (key_norm is not None, output_norm is not None)
        ctx.save_for_backward(query, key_norm, output_norm, *saved)
        return o

    @staticmethod
    def backward(ctx, grad_o):
        history = ctx.history
        _check_read_once(history, ctx.step, ctx.read)
        query, key_norm, output_norm, *saved = ctx.saved_tensors
        grads, accumulate = history._gradient_rows(ctx.count)
        dq, dg, dh = _backward(history._rows[:ctx.count], grads, accumulate,
                               ctx.call, query, key_norm, output_norm, saved,
                               grad_o, *ctx.constants)
        return (grad_o.new_empty(0), dq, dg if ctx.has[0] else None,
                dh if ctx.has[1] else None, None, None, None, None, None,
                None, None)


# --- the two implementations ------------------------------------------------

def _forward(rows, call, query, key_norm, output_norm, eps, scale, save):
    """o in the caller's layout, and the tensors the backward needs."""
    if rows.is_cuda:
        from . import ops
        N, D = call.N, call.D
        q = query if call.multi_query else query.unsqueeze(0)
        o, lse, o_pre, residual = torch.ops.attnres.forward(
            [rows.reshape(call.L, N, D)], q, key_norm, output_norm, eps,
            scale, save)
        kept = ops._kept(save, output_norm, o, o_pre)
        out = o.reshape((call.M,) + call.lead + (D,))
        return (out if call.multi_query else out.squeeze(0)), \
            (lse, kept, residual if residual.numel() else None)
    from .reference import attnres_reference
    o, lse = attnres_reference(rows, query, key_norm_weight=key_norm,
                               output_norm_weight=output_norm, eps=eps,
                               scale=scale, return_lse=True)
    return o, (lse,)


def _backward(rows, grads, accumulate, call, query, key_norm, output_norm,
              saved, grad_o, eps, scale, save):
    """Adds (or writes) the rows' gradients into `grads`; returns dq, dg,
    dh in the parameters' dtypes."""
    if rows.is_cuda:
        N, D = call.N, call.D
        lse, kept, residual = saved
        q = query if call.multi_query else query.unsqueeze(0)
        dq, dg, dh = torch.ops.attnres.backward_into(
            [rows.reshape(call.L, N, D)], q, key_norm, output_norm,
            grad_o.to(rows.dtype).reshape(call.M, N, D).contiguous(), lse,
            kept, residual, eps, scale, save,
            grads.view(call.L, N, D), accumulate)
        return dq.reshape(query.shape), dg, dh
    from .reference import attnres_backward_reference
    (lse,) = saved
    dv, dq, dg, dh = attnres_backward_reference(
        rows, query, grad_o, key_norm_weight=key_norm,
        output_norm_weight=output_norm, eps=eps, scale=scale, lse=lse)
    if accumulate:
        dv = dv + grads.to(dv.dtype)
    grads.copy_(dv)
    return (dq.to(query.dtype),
            dg.to(key_norm.dtype) if dg is not None else None,
            dh.to(output_norm.dtype) if dh is not None else None)
