"""A residual history for models: every layer output read by AttnRes where
the layer wrote it, its gradients accumulated in place in one buffer.

In a Full AttnRes stack layer i reads the embedding and every earlier
layer's output. With :func:`attnres.attnres` each output is its own
autograd input: a source read by k later layers gets k gradient tensors
that autograd adds with k - 1 extra kernels, and every call pays host time
per source. :class:`ResidualHistory` keeps the outputs themselves as its
rows (the kernels read them through a device table of their addresses:
no copy) and their gradients as the rows of one preallocated
``[capacity, ..., D]`` buffer: layer i's AttnRes reads rows ``[0, i)``,
and its backward kernel adds each row's gradient into the gradient buffer
in place (the ``accumulate`` form of the backward op: a
read-modify-write of the row, no separate add). Each appended output gets
its gradient back as a view of that buffer from the backward of the first
read after it, which autograd runs after every later read's (the reads
form a chain of empty tensors, each read's input the one before it
returned). Megatron-LM's weight-gradient accumulation fusion is the
precedent.

    history = attnres.nn.ResidualHistory(capacity=len(layers) + 1)
    history.start(embedding)
    for layer in layers:
        x = history.attend(layer.query, key_norm_weight=layer.key_norm,
                           output_norm_weight=layer.pre_norm)
        history.append(layer(x))
    out = history.attend(final_query)

CUDA tensors run the compiled kernels (PyTorch >= 2.4); CPU tensors the
float64 formulas of :mod:`attnres.reference`, with the same gradient
buffer and the same autograd structure (for tests, and devices the
compiler does not target).

Under torch.compile (fullgraph) the Python bookkeeping above cannot be
traced. A traced step's reads chain through the custom op
``attnres::history_forward`` instead (attnres.ops): its carrier output,
[capacity, N, D] with no memory, has the gradient buffer as its gradient,
which each read's backward receives from the next read, adds into with
the accumulating kernel and passes on, so the compiled backward also
accumulates in place in one buffer. Reads with an extra source, and reads
inside :meth:`ResidualHistory.checkpoint`, take the list op
(:func:`attnres.attnres`: autograd adds their gradients).
"""

import re
import sys
import weakref

import torch

from .errors import InvalidArgumentError

_PACKAGE = sys.modules[__package__]


class HistoryError(InvalidArgumentError):
    """A residual history used against its rules (capacity, shapes, a
    backward through a history that was started again or ran already)."""


class _StepState:
    """What the backward of a history's reads needs: the rows, the gradient
    buffer and the table of row addresses, and the step's bookkeeping. The
    reads' autograd functions hold this, never the history: the history
    holds the last read's link and the outputs appended since (tensors
    whose autograd graph holds those functions), and a cycle through
    autograd's graph is one Python's collector cannot free (a dropped
    history would keep its last step's graph, rows and saved tensors)."""

    def __init__(self, capacity):
        self.capacity = capacity
        self._rows = []         # the rows: the appended outputs
        self._versions = []     # their version counters when appended
        self._grads = None      # [capacity, *shape], the rows' gradients
        self._row_table = None  # [capacity] int64: the rows' addresses
        self._row_pointers = []  # the same addresses, on the host
        self._step = 0          # the eager step in flight (None: traced)
        self._read_rows = 0     # rows some read of this step read
        self._written = 0       # gradient rows written this backward
        self._backwards = set()  # reads whose backward ran this step
        # A paired read's contributions to its rows but the last, which the
        # next read's backward adds with its own (_Deferred).
        self._deferred = None
        self._pair_buffers = None  # _PairBuffers, once a read paired

    # --- backward bookkeeping ---------------------------------------------

    def _check_step(self, step, what):
        if step != self._step:
            later = f"step {self._step}" if self._step is not None else \
                "a step under torch.compile"
            raise HistoryError(
                f"{what} of a residual history's step {step} after {later} "
                f"started: its rows were released and its gradient rows are "
                f"shared (keep one history per step in flight, or run the "
                f"backward before the next start)")

    def _gradient_rows(self, count):
        """The gradient rows [0, count) and whether the backward adds into
        them: rows some later reader's backward wrote already are added to,
        the others written (the first backward, the last reader's, writes
        every row it reads)."""
        if self._written == 0:
            self._check_rows_unchanged()
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

    def _add_nothing(self, count):
        """A read whose output got no gradient: its rows' gradients are
        zero (written as such where its backward is the first)."""
        self._flush_deferred()
        grads, accumulate = self._gradient_rows(count)
        if not accumulate:
            grads.zero_()

    def _flush_deferred(self):
        """Adds a paired read's deferred contributions on their own,
        where the backward that runs next cannot take them with its own."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            deferred.flush(self)

    def _check_rows_unchanged(self):
        """Refuses a backward (before it computes anything) where a row
        some read read was modified in place after it was appended: the
        reads saw other values than the backward would read."""
        for row, (tensor, version) in enumerate(zip(
                self._rows[:self._read_rows], self._versions)):
            if version is not None and tensor._version != version:
                raise HistoryError(
                    f"row {row} of the residual history was modified in "
                    f"place after it was appended: its readers' gradients "
                    f"would be wrong (append a copy, or modify it before "
                    f"appending)")


def _ops():
    """attnres.ops, imported on first use (it needs PyTorch >= 2.4 and the
    runtime library) and then looked up on the package, which costs the
    reads less host time than an import statement; a stand-in set there
    (the CPU tests') is the one used."""
    ops = getattr(_PACKAGE, "ops", None)
    if ops is None:
        from . import ops
    return ops


def _capturing(tensor):
    """Whether a CUDA graph capture records the work on `tensor` (CUDA)."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def _launches_kernels(row):
    """Whether the history's reads of rows like `row` launch the compiled
    kernels through device tables of row addresses (CUDA; the tests stand
    a CPU imitation of the launches in here), rather than run the float64
    formulas."""
    return row.is_cuda


# attnres::history_forward needs torch.library.custom_op (PyTorch >= 2.4),
# as torch.compile of the package's ops does.
_HAS_CUSTOM_OPS = hasattr(torch.library, "custom_op")


class ResidualHistory:
    """Layer outputs of one step, for AttnRes.

    ``capacity`` rows at most: the first output (:meth:`start`) and each
    one :meth:`append`\\ ed after it, kept until the next start. The
    gradient buffer and the device table of row addresses are allocated by
    the first :meth:`start` of a shape, dtype and device and reused by later
    ones (so that a captured CUDA graph replays on the same addresses); a
    :meth:`start` of another shape allocates again.
    """

    def __init__(self, capacity):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or \
                capacity < 1:
            raise HistoryError(
                f"capacity must be an int >= 1 (rows of the history), got "
                f"{capacity!r}")
        self.capacity = capacity
        # What the reads' backward needs: the reads' autograd functions hold
        # it, not the history (see _StepState).
        self._state = _StepState(capacity)
        self._traced = False    # whether torch.compile traced the start
        self._carrier = None    # a traced step's chain (ops.history_forward)
        self._carried = 0       # rows whose gradients the chain returned
        self._in_checkpoint = False  # tracing a history.checkpoint
        self._row_like = None   # (shape, dtype, device) of every row
        self._row_entries = ()  # the row table's entries, one view each
        self._row_filled = []   # (_fill_row_entry)
        self._count = 0
        self._eager_steps = 0   # eager steps started
        self._token = None      # the last read's link of the chain
        self._pending = []      # (row, output) appended since the last read
        self._reads = 0
        self._plans = {}         # the eager CUDA path's, by signature
        self._read_log = None   # rows each read of a checkpoint's first
        #                         run read, in order
        self._replay = None     # the same, replayed by its recomputation

    @property
    def _recomputing(self):
        """In a checkpoint's recomputation (it replays its first run's
        reads)."""
        return self._replay is not None

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
        self._row_like = (tuple(first.shape), first.dtype, first.device)
        self._count = 0
        self._state._rows = []
        self._traced = _tracing()
        if self._traced:
            # An eager step's backward is refused from here on (its rows are
            # released): a stored constant, not a count Dynamo would guard
            # on and recompile for at every step.
            self._state._step = None
            self._pending, self._token, self._state._versions = [], None, []
            D = first.shape[-1]
            self._carrier = first.new_zeros(()).expand(
                (self.capacity, first.numel() // D, D))
            self._carried = 0
            self._append(first)
            return
        self._eager_steps += 1
        state = self._state
        state._step = self._eager_steps
        state._versions = []
        state._read_rows = 0
        shape = (self.capacity,) + tuple(first.shape)
        # (Buffers made under inference mode cannot be written outside it.)
        if state._grads is None or tuple(state._grads.shape) != shape or \
                state._grads.dtype != first.dtype or \
                state._grads.device != first.device or \
                state._grads.is_inference() != \
                torch.is_inference_mode_enabled():
            state._grads = torch.empty(shape, dtype=first.dtype,
                                       device=first.device)
            self._plans = {}
            state._row_table, self._row_entries = None, ()
            if _launches_kernels(first):
                state._row_table = torch.zeros(self.capacity,
                                               dtype=torch.int64,
                                               device=first.device)
                self._row_entries = state._row_table.unbind(0)
                # What the last write to each entry wrote, (address, stream),
                # or False where a CUDA graph capture wrote it.
                self._row_filled = [None] * self.capacity
        state._row_pointers = []
        state._written = 0
        state._backwards = set()
        state._deferred = None
        self._reads = 0
        # The chain's first link (the reads' links require a gradient
        # wherever their inputs do).
        self._token = first.new_empty(0)
        self._pending = []
        self._append(first)

    def release(self):
        """Ends the step without its backward: drops its rows, the outputs
        appended since the last read and the link to the last read's
        graph, so that nothing of the step stays alive through the
        history; a later backward through the step is refused, as after the
        next :meth:`start`. A step's backward or the next start does the
        same; release is for a step whose graph is dropped unrun (an
        evaluation with autograd on, an exception) where a function given
        to :meth:`checkpoint` holds the history: the checkpoint's graph
        holds that function for its recomputation, the history holds the
        graph, and a cycle through autograd's graph is one Python's
        collector cannot free."""
        if _tracing():
            raise HistoryError(
                "release under torch.compile: release the history outside "
                "the compiled region")
        self._eager_steps += 1
        self._state._step = self._eager_steps
        self._state._rows, self._state._versions = [], []
        self._state._deferred = None
        self._token, self._pending, self._carrier = None, [], None
        self._row_like, self._count, self._carried = None, 0, 0

    def append(self, output):
        """Appends a layer's output ([..., D], the shape, dtype and device
        of the first row) as the next row: the output itself, not a copy
        (on CUDA, unless it is not dense and 16-byte aligned), so it must
        not be modified in place once a read has read it. Its gradient from
        the history's readers comes back to it as a view of the gradient
        buffer (a copy where it may reach a leaf as it is, whose .grad
        autograd would keep)."""
        if self._row_like is None:
            raise HistoryError("append before start: the first row (the "
                               "embedding) starts a step")
        self._append(output)

    def _append(self, output):
        if self._recomputing:
            # A checkpoint's recomputation: its first run appended the row
            # (the output of that run, which the graph's later reads took).
            return
        if not isinstance(output, torch.Tensor):
            raise HistoryError(
                f"append takes a tensor, got {type(output).__name__}")
        self._check_like_a_row(output, f"row {self._count}",
                               "as the first row")
        if self._count >= self.capacity:
            raise HistoryError(
                f"append past the capacity: the history holds "
                f"{self.capacity} rows (the first and {self.capacity - 1} "
                f"appended)")
        if self._traced:
            if self._in_checkpoint:
                # PyTorch's compiler traces a checkpoint's function as a
                # subgraph that may have no side effects, and its
                # recomputation replays the graph, not the function.
                raise HistoryError(
                    "append inside history.checkpoint under torch.compile: "
                    "return the output from the checkpointed function and "
                    "append it after the checkpoint")
            self._state._rows.append(output)
            self._count += 1
            return
        self._check_not_traced("append")
        # The row is the output itself, read in place through the table of
        # row addresses (a copy where the kernels cannot read it: not dense
        # or not 16-byte aligned). Outside autograd: the output's gradient
        # comes from the next read.
        row = output.detach()
        if _launches_kernels(row):
            ops = _ops()
            row = ops.dense(row)
            pointer = row.data_ptr()
            self._fill_row_entry(ops, row, pointer)
            self._state._row_pointers.append(pointer)
        self._state._rows.append(row)
        # (Inference tensors have no version counter: nothing can build a
        # backward on them.)
        self._state._versions.append(None if row.is_inference() else
                                     row._version)
        self._pending.append((self._count, output))
        self._count += 1

    def _fill_row_entry(self, ops, row, pointer):
        """Writes the row's address into its entry of the row table, unless
        the last write to that entry, on the current stream, wrote the same
        address (a training loop's rows come back at the same addresses
        step after step): an append then launches nothing. An entry written
        during a CUDA graph capture is written every time after: the graph's
        replays write it too, when the history does not see them."""
        entry = self._count
        if _capturing(row):
            self._row_entries[entry].fill_(pointer)
            self._row_filled[entry] = False
            return
        filled = self._row_filled[entry]
        written = (pointer, ops._raw_stream(row.get_device()))
        if filled != written:
            self._row_entries[entry].fill_(pointer)
            if filled is not False:
                self._row_filled[entry] = written

    def __len__(self):
        return self._count

    @property
    def rows(self):
        """The rows so far, ``[len(self), ..., D]`` (a copy)."""
        if self._row_like is None:
            raise HistoryError("the history has not started")
        return torch.stack(self._state._rows)

    # --- reading ---------------------------------------------------------

    def attend(self, query, *, key_norm_weight=None, output_norm_weight=None,
               eps=1e-6, scale=1.0, save="o_pre", extra_source=None):
        """AttnRes over every row so far (the arguments of
        :func:`attnres.attnres`, the sources being the rows): ``[..., D]``,
        or ``[M, ..., D]`` for a 2-D query.

        `extra_source`, a tensor of a row's shape, dtype and device, is one
        more source after the rows, not kept in the history: Block
        AttnRes's partial sum of the current block (the rows being the
        embedding and the completed blocks' sums). Its gradient is its own
        (autograd's), the rows' go to the history."""
        if self._row_like is None or self._count == 0:
            raise HistoryError("attend before start: the history has no rows")
        if extra_source is not None:
            self._check_like_a_row(extra_source, "extra_source", "a row's")
        count = self._read_count()
        if self._traced:
            # (A read without autograd must leave the chain alone: the list
            # op's forward serves it.)
            if extra_source is None and not self._in_checkpoint and \
                    _HAS_CUSTOM_OPS and torch.is_grad_enabled():
                return self._carried_attend(count, query, key_norm_weight,
                                            output_norm_weight, eps, scale,
                                            save)
            return _listed_attend(self._state._rows[:count], extra_source,
                                  query, key_norm_weight, output_norm_weight,
                                  eps, scale, save)
        self._check_not_traced("attend")
        plan = _plan_for(self, count, query, key_norm_weight,
                         output_norm_weight, eps, scale, save,
                         extra_source is not None)
        token, pending_rows, pending = self._link(count)
        o, token = _Attend.apply(token, query, key_norm_weight,
                                 output_norm_weight, extra_source,
                                 self._state, count, plan, self._reads,
                                 pending_rows, eps, scale, save, *pending)
        self._reads += 1
        if not self._recomputing and torch.is_grad_enabled():
            self._token = token
        return o

    def read_block(self, queries, *, key_norm_weight=None, eps=1e-6,
                   scale=1.0):
        """Block AttnRes: every row so far (the embedding and the completed
        blocks' summaries) read once by the queries of all layers of the
        next block, ``[S, R]`` (S <= 16). Returns a :class:`BlockRead`
        whose ``input(m, partial)`` is layer m's input: that read merged
        with the partial sum of the block's earlier outputs. Append the
        block's sum when the block is done."""
        if self._row_like is None or self._count == 0:
            raise HistoryError("read_block before start: the history has no "
                               "rows")
        if not isinstance(queries, torch.Tensor) or queries.dim() != 2:
            raise HistoryError(
                f"read_block takes the block's queries as one [S, R] tensor, "
                f"got {getattr(queries, 'shape', type(queries).__name__)}")
        count = self._read_count()
        dtype = self._row_like[1]
        if self._traced:
            o, lse = _listed_partial(self._state._rows[:count], queries,
                                     key_norm_weight, eps, scale)
            return BlockRead(o, lse, queries, key_norm_weight, eps, scale,
                             dtype)
        self._check_not_traced("read_block")
        plan = _Plan(_check(_checked_sources(self._state, count, False),
                            queries, key_norm_weight, None, eps, scale,
                            "o_pre"))
        token, pending_rows, pending = self._link(count)
        o, lse, token = _ReadPartial.apply(
            token, queries, key_norm_weight, self._state, count, plan,
            self._reads, pending_rows, eps, scale, *pending)
        self._reads += 1
        if not self._recomputing and torch.is_grad_enabled():
            self._token = token
        return BlockRead(o, lse, queries, key_norm_weight, eps, scale,
                         dtype)

    def checkpoint(self, function, *args, **kwargs):
        """``torch.utils.checkpoint.checkpoint(function, *args, **kwargs)``
        (non-reentrant) for a function that reads this history, and may
        append to it: each read of its recomputation in the backward reads
        the rows the same read of the first run read, not those appended
        since, and the recomputation's appends are skipped (the first
        run's outputs are the rows). Where the step's graph may be dropped
        without its backward, :meth:`release` the history after it (the
        graph holds `function`, which holds the history)."""
        from torch.utils.checkpoint import checkpoint
        if self._traced:
            # A traced checkpoint recomputes its traced graph, which holds
            # the rows it read: nothing to pin. Its reads take the list op
            # (the chain's state may not change inside it).
            self._in_checkpoint = True
            try:
                return checkpoint(function, *args, use_reentrant=False,
                                  **kwargs)
            finally:
                self._in_checkpoint = False
        self._check_not_traced("checkpoint")
        # The rows each read of the first run read, replayed in order by
        # the recomputation (the function may append between its reads).
        counts = []
        runs = []
        step = self._state._step
        # (Weakly: the graph holds this function until its backward, and
        # the history holds the graph.)
        history_ref = weakref.ref(self)

        def pinned(*inner_args, **inner_kwargs):
            # The second run is the recomputation: it must leave the chain,
            # the rows and the pending outputs as the rest of the step left
            # them. (A function that reads the history holds it.)
            history = history_ref()
            if history is None:
                return function(*inner_args, **inner_kwargs)
            previous = history._read_log, history._replay
            if runs:
                history._state._check_step(step, "a checkpoint's "
                                           "recomputation")
                history._read_log, history._replay = None, iter(counts)
            else:
                history._read_log, history._replay = counts, None
            runs.append(True)
            try:
                return function(*inner_args, **inner_kwargs)
            finally:
                history._read_log, history._replay = previous

        return checkpoint(pinned, *args, use_reentrant=False, **kwargs)

    def _link(self, count):
        """A read's inputs from the chain: the last link, and the outputs
        appended since the last read (rows below `count`) with their rows,
        whose gradients the read's backward returns. A read without
        autograd (no_grad, inference mode) takes none and leaves the chain
        as it is, and so does a checkpoint's recomputation (its graph is
        thrown away)."""
        if self._recomputing or not torch.is_grad_enabled():
            return self._token, (), ()
        self._state._read_rows = max(self._state._read_rows, count)
        pending = self._pending
        if not pending or pending[-1][0] < count:
            # (Rows are appended in order: the usual read takes them all.)
            taken, self._pending = pending, []
        else:
            taken = [(row, output) for row, output in pending if row < count]
            self._pending = [(row, output) for row, output in pending
                             if row >= count]
        # A gradient a leaf would keep as its .grad gets a copy, not the
        # gradient buffer's row, which the next step overwrites.
        return self._token, tuple((row, _may_reach_a_leaf(output))
                                  for row, output in taken), \
            tuple(output for _, output in taken)

    def _carried_attend(self, count, query, key_norm, output_norm, eps,
                        scale, save):
        """A traced step's read on the chain of attnres::history_forward:
        its backward adds the rows' gradients into the chain's buffer and
        returns those of the rows appended since the chain's last read."""
        from . import _checks, ops  # noqa: F401  (registers the op)
        rows = self._state._rows[:count]
        call = _checks.check_attnres(rows, query, key_norm, output_norm, eps,
                                     scale, save, any_device=True)
        N, D = call.N, call.D
        q = query if call.multi_query else query.unsqueeze(0)
        o, _, _, _, self._carrier = torch.ops.attnres.history_forward(
            [row.reshape(N, D) for row in rows], self._carrier, q, key_norm,
            output_norm, float(eps), float(scale), save,
            min(self._carried, count))
        self._carried = max(self._carried, count)
        o = o.reshape((call.M,) + call.lead + (D,))
        return o if call.multi_query else o.squeeze(0)

    def _check_not_traced(self, what):
        if _tracing():
            raise HistoryError(
                f"{what} under torch.compile in a step started outside it: "
                f"compile the whole step, start included, or none of it")

    def _read_count(self):
        """The rows a read reads: every row so far, or, in a checkpointed
        function's recomputation, those the same read of its first run
        read."""
        if self._replay is not None:
            count = next(self._replay, None)
            if count is None:
                raise HistoryError(
                    "a checkpointed function read the residual history more "
                    "times in its recomputation than in its first run: it "
                    "must read the same way both times")
            return count
        if self._read_log is not None:
            self._read_log.append(self._count)
        return self._count

    def _check_like_a_row(self, value, name, whose):
        row_shape, dtype, device = self._row_like
        if not isinstance(value, torch.Tensor) or \
                tuple(value.shape) != row_shape or \
                value.dtype != dtype or value.device != device:
            raise HistoryError(
                f"{name} must be a {list(row_shape)} {dtype} tensor on "
                f"{device} ({whose}), got {_describe(value)}")


# Backward nodes that may hand the gradient they get (or a view of it) on
# to an input: identities, views, the adds' and copies' first operands;
# Cat and Stack hand on narrower views. Any other node makes new tensors.
# Those in _FIRST_ONLY hand it on to their first operand only (the others'
# gradients are products or negations: new tensors).
_FIRST_OPERAND = "Sub|Addmm|Addbmm|Baddbmm|Addmv|Addr|Addcmul|Addcdiv"
_PASSING = re.compile(
    rf"({_FIRST_OPERAND}|Add|Clone|ToCopy|Alias|Lift|LiftFresh|Expand|Sum|"
    r"View|ReshapeAlias|UnsafeView|T|Transpose|Permute|Squeeze|Unsqueeze|"
    r"AsStrided|Narrow|Conj|Real|Imag|ViewAsReal|ViewAsComplex|Copy|Cat|"
    r"Stack)Backward\d*|CopySlices|CopyBackwards")
_NARROWING = re.compile(r"(Cat|Stack)Backward\d*")
_FIRST_ONLY = re.compile(rf"({_FIRST_OPERAND})Backward\d*")


def _may_reach_a_leaf(output, budget=64):
    """Whether the gradient returned for `output` may become a leaf's .grad
    as it is, or as a view: autograd keeps a gradient that nothing else
    holds as the leaf's .grad, and the history's gradient rows are
    overwritten by the next step. A walk back from `output` through the
    nodes that may pass a gradient on (and Python autograd functions not
    the package's own), to a leaf of the row's size (or smaller, past a
    concatenation); conservative: a copy too many costs a row's copy, one
    too few a wrong gradient."""
    if output.is_leaf:
        return output.requires_grad
    numel = output.numel()
    stack = [(output.grad_fn, False)]
    seen = set()
    while stack:
        node, narrowed = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if len(seen) > budget:
            return True
        name = type(node).__name__
        if name == "AccumulateGrad":
            size = node.variable.numel()
            if size == numel or (narrowed and size < numel):
                return True
            continue
        forward = getattr(node, "_forward_cls", None)
        if forward is not None:
            if forward.__module__.startswith(__package__ + "."):
                continue  # the package's own: their backwards compute
        elif not _PASSING.fullmatch(name):
            continue
        narrowed = narrowed or bool(_NARROWING.fullmatch(name))
        inputs = node.next_functions
        if _FIRST_ONLY.fullmatch(name):
            inputs = inputs[:1]
        stack.extend((next_node, narrowed) for next_node, _ in inputs)
    return False


def _tracing():
    """Whether torch.compile (Dynamo) is tracing the caller."""
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and compiler.is_compiling()


def _listed_attend(rows, extra, query, key_norm, output_norm, eps, scale,
                   save):
    """A traced step's read: AttnRes over the rows (a list) and the extra
    source, by the list op (CUDA) or the float64 formulas (CPU), under
    autograd's own accounting."""
    sources = rows + ([extra] if extra is not None else [])
    if sources[0].is_cuda:
        from . import api
        return api.attnres(sources, query, key_norm_weight=key_norm,
                           output_norm_weight=output_norm, eps=eps,
                           scale=scale, save=save)
    from .reference import attnres_reference
    return attnres_reference(torch.stack(sources), query,
                             key_norm_weight=key_norm,
                             output_norm_weight=output_norm, eps=eps,
                             scale=scale)


def _listed_partial(rows, queries, key_norm, eps, scale):
    """A traced step's block read: the partial result (o, lse) of the rows
    for each query."""
    if rows[0].is_cuda:
        from . import api
        return api.attnres_partial(rows, queries, key_norm_weight=key_norm,
                                   eps=eps, scale=scale)
    from .reference import attnres_partial_reference
    return attnres_partial_reference(torch.stack(rows), queries,
                                     key_norm_weight=key_norm, eps=eps,
                                     scale=scale)


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {value.dtype} on {value.device}"
    return type(value).__name__


def _check_backward(state, step, read):
    """Refuses a read's backward that would be wrong: one that builds a
    graph, one of a step the next start released, a second one."""
    if torch.is_grad_enabled():
        # Its formulas would be recorded with the rows and the saved
        # softmax statistics as constants, and its in-place gradient rows
        # would carry a graph past the step: wrong second derivatives.
        raise HistoryError(
            "a backward with create_graph=True through a residual history's "
            "read: its backward is not differentiable (gradient penalties, "
            "double backward); take those through attnres.reference's "
            "formulas, or keep the history's reads out of that graph")
    state._check_step(step, "a backward")
    if read in state._backwards:
        raise HistoryError(
            "a second backward through a residual history's read: its "
            "gradients were added into the history once already (run the "
            "step again, or keep the graph's gradients with another "
            "history)")
    state._backwards.add(read)


class BlockRead:
    """What :meth:`ResidualHistory.read_block` read: the FP32 partial
    result (o, lse) of the history's rows for each query of a block."""

    def __init__(self, o, lse, queries, key_norm, eps, scale, dtype):
        self.o, self.lse = o, lse            # [S, ..., D] f32, [S, ...]
        self.queries, self.key_norm = queries, key_norm
        self.eps, self.scale, self.dtype = eps, scale, dtype

    def input(self, m, partial=None, *, output_norm_weight=None):
        """Layer m's input: AttnRes over the history's rows and `partial`
        (the sum of the block's earlier outputs, a row's shape; None for
        the block's first layer), with query m and the output norm `h`
        ([D]) if given, in the rows' dtype (or h's)."""
        o, lse = self.o[m], self.lse[m]
        cuda = o.is_cuda
        if partial is None and output_norm_weight is None:
            return o.to(self.dtype)  # one partition: nothing to merge
        if partial is not None:
            # The partial sum is one more source: its partial result is
            # itself and its logit.
            if cuda:
                import attnres
                o_p, lse_p = attnres.attnres_partial(
                    [partial], self.queries[m], key_norm_weight=self.key_norm,
                    eps=self.eps, scale=self.scale)
            else:
                from .reference import attnres_partial_reference
                o_p, lse_p = attnres_partial_reference(
                    partial[None], self.queries[m],
                    key_norm_weight=self.key_norm, eps=self.eps,
                    scale=self.scale)
            o = torch.stack([o, o_p.to(o.dtype)])
            lse = torch.stack([lse, lse_p.to(lse.dtype)])
        else:
            o, lse = o[None], lse[None]
        if cuda:
            import attnres
            merged, _ = attnres.partition_reduce(
                o, lse, output_norm_weight=output_norm_weight, eps=self.eps)
        else:
            from .reference import partition_reduce_reference
            merged, _ = partition_reduce_reference(
                o, lse, output_norm_weight=output_norm_weight, eps=self.eps)
        dtype = output_norm_weight.dtype if output_norm_weight is not None \
            else self.dtype
        return merged.to(dtype)


# --- paired reads -------------------------------------------------------------
# Read i's backward must hand back row i - 1's gradient complete (layer
# i - 1's backward takes it next), but nothing needs rows 0..i-2's before
# read i - 1's backward, which reads the same rows. Where both reads are
# large, read i's backward adds only into row i - 1 (the accumulating
# kernel with null entries for rows 0..i-2: it still reads every row for
# its dq and dg), and read i - 1's adds both reads' contributions to rows
# 0..i-2 in one two-query pass: one read-modify-write of each gradient row
# for the two reads instead of two, (4i + 8) rows moved per pair instead
# of (6i + 1). The kernels' M queries share one key-norm weight, but a
# read's logits depend on its query q and key-norm weight g only through
# q * g (the key is g * v / rms(v)), so the pass runs the products q * g
# (float32: exact for bf16 and f16 values) against a weight of ones, and
# read i - 1's gradients are dq = g dq' and dg = q dq'. docs/Performance.md
# ("A whole model") has the measurements that set the threshold.

# The fewest rows the first read of a pair reads (its partner reads one
# fewer). Below it the two-query pass, slower per byte than the one-query
# kernels, and the pair's four row copies cost more than they save.
_PAIR_MIN_ROWS = 32
# The smallest row (bytes of [N, D]) a pair is made of. A pair costs the
# host a dozen more launches (its copies, the products, dq and dg from the
# pass's dq') and saves about 2i rows of traffic, which pays from rows of
# a few MiB (N = 512 tokens at D = 4096 in bf16); smaller ones are host
# bound already.
_PAIR_MIN_ROW_BYTES = 4 << 20
# The pair's pass is compiled with its rows staged through shared memory
# (two batches in flight), as the one-query backward is by default: the
# kernel choices for M > 1 keep the rows in registers, which at D = 4096
# leaves one block a multiprocessor. Measured on an H100, (64, 2048, 4096):
# the stack's AttnRes share 44.6 ms staged against 46.4 ms with the default
# choices (48.1 ms unpaired); docs/Performance.md.
_PAIR_KERNEL_OPTIONS = "backward-staged-batches=2"

# A Block read's partial sum (its extra source) gets its gradient from the
# accumulating backward that adds into the rows' gradients. Compiled with
# write-tags, that backward writes the partial sum's gradient over (its
# table entry tagged in bit 0) instead of adding into zeros filled for it:
# on an H100 the Block shares fell by 0.2-1.3 ms (docs/Performance.md).
# Only these reads' bundles are compiled so: the test of the tag costs an
# accumulating backward a register and a branch a source, which every
# other read's kernels (the Full reads', the op's) are spared.
_TAG_KERNEL_OPTIONS = "write-tags=1"


def _may_defer(ctx):
    """Whether a read's backward may leave rows 0..count-2 to the next
    read's: a pairable read (one query, a key norm, no output norm or
    extra source, o_pre saved) of enough rows large enough, returning no
    gradient of those rows now."""
    plan = ctx.plan
    return plan.pairable and pairs_at(ctx.count, plan.row_bytes) and \
        all(row >= ctx.count - 1 for row, _ in ctx.pending_rows)


def pairs_at(rows, row_bytes):
    """Whether a pairable read of `rows` rows of `row_bytes` bytes each is
    large enough to be the first of a pair (its partner reads one row
    fewer, two at least)."""
    return rows >= max(_PAIR_MIN_ROWS, 3) and \
        row_bytes >= _PAIR_MIN_ROW_BYTES


def _unless_capturing(make):
    """`make()`, and whether to keep it: not a device tensor a CUDA graph
    capture made (it holds data only in the graph's replays)."""
    capturing = torch.cuda.is_available() and \
        torch.cuda.is_current_stream_capturing()
    return make(), not capturing


class _PairBuffers:
    """The two reads' inputs of a pair's pass, stacked ([2, N, D] ...),
    and the products q * g ([2, R]); made once a history's rows have a
    shape."""

    def __init__(self, call, dtype, device):
        N, D = call.N, call.D
        self.shape = (N, D, call.R, dtype)
        self.do = torch.empty((2, N, D), dtype=dtype, device=device)
        self.o = torch.empty_like(self.do)
        self.lse = torch.empty((2, N), dtype=torch.float32, device=device)
        self.residual = torch.empty((2, N, D // 2), dtype=torch.int8,
                                    device=device) if call.residual else None
        self.products = torch.empty((2, call.R), dtype=torch.float32,
                                    device=device)
        self.ones = torch.ones(call.R, dtype=torch.float32, device=device)

    def fill(self, slot, grad_o, saved, query, key_norm):
        lse, kept, residual = saved
        self.do[slot].view(grad_o.shape).copy_(grad_o)
        self.o[slot].view(kept.shape).copy_(kept)
        self.lse[slot].copy_(lse.view(-1))
        if residual is not None:
            self.residual[slot].copy_(residual.view(self.residual[slot].shape))
        self.products[slot].copy_(query)
        self.products[slot].mul_(key_norm)


def _pair_buffers(state, plan):
    buffers = state._pair_buffers
    call = plan.call
    if buffers is None or \
            buffers.shape != (call.N, call.D, call.R, plan.dtype):
        buffers, keep = _unless_capturing(
            lambda: _PairBuffers(call, plan.dtype, plan.eager.device))
        if keep:
            state._pair_buffers = buffers
    return buffers


def _pair_call(call):
    """The checked call of the two-query pass over the rows of `call` (a
    read of the history's rows, one query): the two reads' float32
    products q * g ([2, R]) against a float32 weight. (The checks read
    shapes and dtypes only: attnres._checks.TensorShape stand-ins.)"""
    from . import _checks
    products = _checks.TensorShape((2, call.R), "torch.float32")
    weight = _checks.TensorShape((call.R,), "torch.float32")
    dtype = {value: name for name, value in _checks.VALUE_TYPES.items()}[
        call.value_type]
    rows = _checks.TensorShape((call.L, call.N, call.D), dtype)
    return _checks.check_attnres(rows, products, weight, None, call.eps,
                                 call.scale, call.save)


class _PairPlan:
    """The two-query backward over a read's rows (_pair_call), writing and
    accumulating."""

    def __init__(self, plan):
        ops = _ops()
        call = _pair_call(plan.call)
        device = plan.eager.device
        self.eager = ops._Plan(call, device, _PAIR_KERNEL_OPTIONS)
        self.accumulating = ops._BackwardLaunch(
            ops._runtime(call.spec(accumulate=True), device,
                         _PAIR_KERNEL_OPTIONS), call.N)


def _accumulating_bundle(call, extra):
    """The bundle (key, kernel options) of the accumulating backward of a
    read of `call`: compiled with write-tags where the read has an extra
    source (the last of `call`'s sources)."""
    return call.spec(accumulate=True), _TAG_KERNEL_OPTIONS if extra else ""


def extra_source_keys(call):
    """The bundles (key, kernel options) a read of `call` with an extra
    source (a Block read's partial sum, the last of `call`'s sources) needs
    beyond the forward's and the writing backward's (call.spec()): its
    accumulating backward (_accumulating_bundle). For prebuilding them
    (attnres.prebuild); `call` may be the checks' result on
    attnres._checks.TensorShape stand-ins."""
    return [_accumulating_bundle(call, extra=True)]


def pair_keys(call):
    """The bundles (key, kernel options) a paired read of `call` needs as
    the partner (_PairPlan's), for prebuilding them (attnres.prebuild);
    `call` may be the checks' result on attnres._checks.TensorShape
    stand-ins."""
    pair = _pair_call(call)
    return [(pair.spec(), _PAIR_KERNEL_OPTIONS),
            (pair.spec(accumulate=True), _PAIR_KERNEL_OPTIONS)]


class _Deferred:
    """The first read of a pair after its backward: what the pair's pass
    needs of it, or a flush (its contributions to rows 0..count-2 alone)
    where the next backward is not its partner's."""

    def __init__(self, count, plan, constants, accumulate, query, key_norm,
                 grad_o, saved):
        self.count, self.plan, self.constants = count, plan, constants
        # Whether rows 0..count-2 hold gradients already (else the pass
        # writes them).
        self.accumulate = accumulate
        self.query, self.key_norm = query, key_norm
        self.grad_o, self.saved = grad_o, saved

    @staticmethod
    def start(state, ctx, accumulate, query, key_norm, saved, grad_o):
        """The first read's own pass: its dq, dg (dh None) over all its
        rows, its contribution to the last row only."""
        plan = ctx.plan
        dq, dg, dh, _ = _launch_backward(
            state, ctx.count, plan, None, accumulate, query, key_norm, None,
            saved, grad_o, plan.table(state, "last"))
        state._deferred = _Deferred(ctx.count, plan, ctx.constants,
                                    accumulate, query, key_norm, grad_o,
                                    saved)
        return dq, dg, dh

    def pairs_with(self, ctx):
        """Whether `ctx`'s read is this one's partner: it reads every row
        but the last of this one's (two or more: a one-source backward
        takes its weight as exactly 1), with the same constants."""
        return ctx.count == self.count - 1 and ctx.count >= 2 and \
            ctx.plan.pairable and ctx.constants == self.constants

    def flush(self, state):
        _launch_backward(state, self.count, self.plan, None, self.accumulate,
                         self.query, self.key_norm, None, self.saved,
                         self.grad_o, self.plan.table(state, "first"))

    def pair(self, state, ctx, query, key_norm, saved, grad_o):
        """The partner's backward: both reads' contributions to its rows in
        one pass; its dq and dg."""
        ops = _ops()
        plan = ctx.plan
        buffers = _pair_buffers(state, plan)
        if plan.pair is None:
            plan.pair = _PairPlan(plan)
        pair = plan.pair
        buffers.fill(0, self.grad_o, self.saved, self.query, self.key_norm)
        buffers.fill(1, grad_o, saved, query, key_norm)
        launch = pair.accumulating if self.accumulate else \
            pair.eager.backward
        dq, _, _ = ops._launch_backward_into(
            pair.eager, launch, state._row_table, plan.grads_table,
            plan.dtype, buffers.products, buffers.ones, None, buffers.do,
            buffers.lse, buffers.o, buffers.residual)
        own = dq[1]
        return (own * key_norm).to(query.dtype), \
            (own * query).to(key_norm.dtype)


def _pending_grads(state, rows):
    """The gradients of the outputs appended as `rows` ((row, may reach a
    leaf) pairs): views of the gradient buffer, complete once the first
    read after them has added in (every later read's backward ran before,
    by the chain). Where the gradient may reach a leaf as it is, a copy:
    autograd would keep the view itself as the leaf's .grad (it takes a
    gradient nothing else holds), which the next step's backward would
    overwrite, and into which a later accumulation (grad += new) would add
    the buffer's row to itself."""
    return tuple(state._grads[row].clone() if leaf else state._grads[row]
                 for row, leaf in rows)


class _Attend(torch.autograd.Function):
    """AttnRes over the history's first `count` rows (read in place through
    the table of row addresses); its backward adds the rows' gradients into
    the history's gradient buffer in the backward kernel and returns those
    of the outputs appended since the read before it."""

    @staticmethod
    def forward(ctx, token, query, key_norm, output_norm, extra, state,
                count, plan, read, pending_rows, eps, scale, save,
                *pending):
        o, saved = _forward(state, count, extra, plan, query, key_norm,
                            output_norm, eps, scale, save)
        ctx.state, ctx.count, ctx.plan = state, count, plan
        ctx.step, ctx.read = state._step, read
        ctx.pending_rows = pending_rows
        ctx.constants = (eps, scale, save)
        ctx.has = (key_norm is not None, output_norm is not None,
                   extra is not None)
        ctx.save_for_backward(query, key_norm, output_norm, extra, *saved)
        # (A read whose output no loss uses still runs its backward, for the
        # chain: given None, it leaves its weights' gradients None, as
        # autograd does for an unused output.)
        ctx.set_materialize_grads(False)
        return o, token.new_empty(0)

    @staticmethod
    def backward(ctx, grad_o, grad_token):
        state = ctx.state
        _check_backward(state, ctx.step, ctx.read)
        if grad_o is None:
            state._add_nothing(ctx.count)
            return (grad_token,) + (None,) * 12 + \
                _pending_grads(state, ctx.pending_rows)
        query, key_norm, output_norm, extra, *saved = ctx.saved_tensors
        deferred = state._deferred
        if deferred is not None and deferred.pairs_with(ctx):
            state._deferred = None
            dq, dg = deferred.pair(state, ctx, query, key_norm, saved,
                                   grad_o)
            dh = d_extra = None
        else:
            state._flush_deferred()
            grads, accumulate = state._gradient_rows(ctx.count)
            if _may_defer(ctx):
                dq, dg, dh = _Deferred.start(state, ctx, accumulate, query,
                                             key_norm, saved, grad_o)
                d_extra = None
            else:
                dq, dg, dh, d_extra = _backward(
                    state, ctx.count, extra, grads, accumulate, ctx.plan,
                    query, key_norm, output_norm, saved, grad_o,
                    *ctx.constants)
        return (grad_token, dq, dg if ctx.has[0] else None,
                dh if ctx.has[1] else None, d_extra, None, None, None, None,
                None, None, None, None,
                *_pending_grads(state, ctx.pending_rows))


class _ReadPartial(torch.autograd.Function):
    """The partial result of the history's first `count` rows for a
    block's queries; its backward (given the gradients of o and lse) adds
    the rows' gradients into the history's gradient buffer in the
    kernel."""

    @staticmethod
    def forward(ctx, token, queries, key_norm, state, count, plan, read,
                pending_rows, eps, scale, *pending):
        rows = state._rows[:count]
        call = plan.call
        if queries.is_cuda:
            _ops()  # (registers torch.ops.attnres)
            o, lse = torch.ops.attnres.partial(
                _sources_of(rows, None, call), queries, key_norm, eps, scale)
            o = o.reshape((call.M,) + call.lead + (call.D,))
            lse = lse.reshape((call.M,) + call.lead)
        else:
            from .reference import attnres_partial_reference
            o, lse = attnres_partial_reference(torch.stack(rows), queries,
                                               key_norm_weight=key_norm,
                                               eps=eps, scale=scale)
        ctx.state, ctx.count, ctx.plan = state, count, plan
        ctx.step, ctx.read = state._step, read
        ctx.pending_rows = pending_rows
        ctx.constants = (eps, scale)
        ctx.has_key_norm = key_norm is not None
        ctx.save_for_backward(queries, key_norm, o, lse)
        ctx.set_materialize_grads(False)  # (as _Attend's)
        return o, lse, token.new_empty(0)

    @staticmethod
    def backward(ctx, grad_o, grad_lse, grad_token):
        state = ctx.state
        _check_backward(state, ctx.step, ctx.read)
        if grad_o is None and grad_lse is None:
            state._add_nothing(ctx.count)
            return (grad_token,) + (None,) * 9 + \
                _pending_grads(state, ctx.pending_rows)
        state._flush_deferred()
        queries, key_norm, o, lse = ctx.saved_tensors
        grad_o = torch.zeros_like(o) if grad_o is None else grad_o.float()
        grad_lse = torch.zeros_like(lse) if grad_lse is None else \
            grad_lse.float()
        rows = state._rows[:ctx.count]
        grads, accumulate = state._gradient_rows(ctx.count)
        eps, scale = ctx.constants
        call = ctx.plan.call
        if queries.is_cuda:
            N, D, M = call.N, call.D, call.M
            dq, dg = torch.ops.attnres.partial_backward_into(
                _sources_of(rows, None, call), queries, key_norm,
                grad_o.reshape(M, N, D).contiguous(),
                grad_lse.reshape(M, N).contiguous(), lse.reshape(M, N),
                o.reshape(M, N, D), eps, scale, grads.view(call.L, N, D),
                accumulate)
        else:
            from .reference import attnres_backward_reference
            dv, dq, dg, _ = attnres_backward_reference(
                torch.stack(rows), queries, grad_o, key_norm_weight=key_norm,
                eps=eps, scale=scale, grad_lse=grad_lse, lse=lse, o_pre=o)
            _store_row_grads(grads, dv, accumulate)
            dq = dq.to(queries.dtype)
            dg = dg.to(key_norm.dtype) if dg is not None else None
        return (grad_token, dq, dg if ctx.has_key_norm else None, None,
                None, None, None, None, None, None,
                *_pending_grads(state, ctx.pending_rows))


# --- the implementations ----------------------------------------------------
# CUDA tensors, eagerly: the runtime's launches from a plan made by the
# first read of a signature (the checks, the bundles, launch counts and
# workspace sizes, the device table of the rows' gradients; the rows' is
# the history's own), so that a read costs about what a linear layer's
# launch does on the host.
# CUDA weights the kernels cannot read in place: the custom ops
# attnres::forward and attnres::backward_into. CPU tensors: the float64
# formulas. (A traced step takes none of these: it reads a list of rows,
# ResidualHistory.start.)

class _Plan:
    """What one signature of a read needs: its Call and, for the eager CUDA
    path, its launches and the device table of its rows' gradients."""

    def __init__(self, call, grads=None, extra=False):
        self.call = call
        self.eager = None
        self.pairable = False   # (the eager CUDA path's reads may pair)
        if grads is None:
            return
        ops = _ops()
        device = grads.device
        self.eager = ops._Plan(call, device)   # forward, writing backward
        self.dtype = grads.dtype
        key, options = _accumulating_bundle(call, extra)
        self.accumulating = ops._BackwardLaunch(
            ops._runtime(key, device, options), call.N)
        # With an extra source the tables are made per call (its address
        # and its gradient's change); the gradient rows' addresses are kept.
        self.extra = extra
        if extra:
            self.grad_pointers = ops._packed_pointers(grads)
        else:
            self.grads_table = ops._packed_table(grads)
        # Paired reads (_Deferred): one query, a key norm, no output norm or
        # extra source, o_pre saved (with its residual where kept), and
        # kernels that leave the rows of null gradient entries alone.
        self.pairable = not extra and not call.multi_query and \
            call.key_norm and not call.output_norm and \
            call.save == "o_pre" and \
            self.accumulating.skips_null_gradients and \
            self.eager.backward.skips_null_gradients
        self.row_bytes = call.N * call.D * grads.element_size()
        self.pair = None     # _PairPlan, where this read is a partner
        self._tables = {}

    def table(self, state, which):
        """The table of gradient rows of a paired read's own pass, "last"
        (row count - 1 only: the other entries null) or of its flush,
        "first" (every row but the last)."""
        table = self._tables.get(which)
        if table is None:
            ops = _ops()
            rows = ops._packed_pointers(state._grads[:self.call.L])
            pointers = (0,) * (len(rows) - 1) + rows[-1:] \
                if which == "last" else rows[:-1] + (0,)
            table, keep = _unless_capturing(
                lambda: ops._pointer_table(pointers, self.eager.device))
            if keep:
                self._tables[which] = table
        return table


def _plan_for(history, count, query, key_norm, output_norm, eps, scale,
              save, extra=False):
    state = history._state
    if state._row_table is not None:
        ops = _ops()
        signature = (ops._weight_signature(query),
                     ops._weight_signature(key_norm),
                     ops._weight_signature(output_norm))
        if False not in signature:
            key = (count, extra) + signature + (type(eps), eps, type(scale),
                                                scale, save)
            plan = history._plans.get(key)
            if plan is None:
                call = _check(_checked_sources(state, count, extra), query,
                              key_norm, output_norm, eps, scale, save)
                plan = _Plan(call, state._grads[:count], extra)
                history._plans[key] = plan
            return plan
    return _Plan(_check(_checked_sources(state, count, extra), query,
                        key_norm, output_norm, eps, scale, save))


def _checked_sources(state, count, extra):
    """What the checks see as the sources, a tensor of the rows' shape and
    dtype with one row a source (they read no values): `count` of them,
    and one more where there is an extra source."""
    rows = state._grads[:count]
    if not extra:
        return rows
    return state._grads[:count + 1] if count < state.capacity else \
        torch.cat([rows, rows[:1]])


def _check(rows, query, key_norm, output_norm, eps, scale, save):
    from . import _checks
    return _checks.check_attnres(rows, query, key_norm, output_norm, eps,
                                 scale, save, any_device=True)


def _sources_of(rows, extra, call):
    """The custom ops' sources: the rows ([..., D] each) as a list of
    [N, D] tensors, with the extra source last."""
    N, D = call.N, call.D
    extra = [extra] if extra is not None else []
    return [row.reshape(N, D) for row in list(rows) + extra]


def _stacked(rows, extra):
    """The CPU formulas' sources: [L, ..., D]."""
    return torch.stack(list(rows) + ([extra] if extra is not None else []))


def _forward(state, count, extra, plan, query, key_norm, output_norm, eps,
             scale, save):
    """o in the caller's layout, and the tensors the backward needs."""
    if plan.eager is not None:
        return _launch_forward(state, count, plan, extra, query, key_norm,
                               output_norm)
    rows = state._rows[:count]
    call = plan.call
    if query.is_cuda:
        ops = _ops()
        q = query if call.multi_query else query.unsqueeze(0)
        o, lse, o_pre, residual = torch.ops.attnres.forward(
            _sources_of(rows, extra, call), q, key_norm, output_norm, eps,
            scale, save)
        kept = ops._kept(save, output_norm, o, o_pre)
        out = o.reshape((call.M,) + call.lead + (call.D,))
        return (out if call.multi_query else out.squeeze(0)), \
            (lse, kept, residual if residual.numel() else None)
    from .reference import attnres_reference
    o, lse = attnres_reference(_stacked(rows, extra), query,
                               key_norm_weight=key_norm,
                               output_norm_weight=output_norm, eps=eps,
                               scale=scale, return_lse=True)
    return o, (lse,)


def _backward(state, count, extra, grads, accumulate, plan, query,
              key_norm, output_norm, saved, grad_o, eps, scale, save):
    """Adds (or writes) the rows' gradients into `grads`; returns dq, dg,
    dh in the parameters' dtypes and the extra source's gradient."""
    if plan.eager is not None:
        return _launch_backward(state, count, plan, extra, accumulate,
                                query, key_norm, output_norm, saved, grad_o)
    rows = state._rows[:count]
    call = plan.call
    if query.is_cuda:
        N, D = call.N, call.D
        lse, kept, residual = saved
        q = query if call.multi_query else query.unsqueeze(0)
        # With an extra source the kernels write one [L, N, D] buffer (the
        # rows' gradients copied in and out: this path serves weights the
        # kernels cannot read in place, not the eager one).
        into = grads.view(count, N, D)
        if extra is not None:
            into = torch.empty((call.L, N, D), dtype=grads.dtype,
                               device=grads.device)
            if accumulate:
                into[:count].copy_(grads.view(count, N, D))
                into[count].zero_()
        dq, dg, dh = torch.ops.attnres.backward_into(
            _sources_of(rows, extra, call), q, key_norm, output_norm,
            grad_o.to(grads.dtype).reshape(call.M, N, D).contiguous(), lse,
            kept, residual, eps, scale, save, into, accumulate)
        d_extra = None
        if extra is not None:
            grads.view(count, N, D).copy_(into[:count])
            d_extra = into[count].reshape(extra.shape)
        return dq.reshape(query.shape), dg, dh, d_extra
    from .reference import attnres_backward_reference
    (lse,) = saved
    dv, dq, dg, dh = attnres_backward_reference(
        _stacked(rows, extra), query, grad_o, key_norm_weight=key_norm,
        output_norm_weight=output_norm, eps=eps, scale=scale, lse=lse)
    _store_row_grads(grads, dv[:count], accumulate)
    d_extra = dv[count].to(extra.dtype) if extra is not None else None
    return (dq.to(query.dtype),
            dg.to(key_norm.dtype) if dg is not None else None,
            dh.to(output_norm.dtype) if dh is not None else None, d_extra)


def _store_row_grads(grads, row_grads, accumulate):
    """The CPU path's in-place gradient rows: `row_grads` written into
    `grads`, or added to what it holds."""
    if accumulate:
        row_grads = row_grads + grads.to(row_grads.dtype)
    grads.copy_(row_grads)


def _tables(state, count, plan, extra, extra_grad=None, extra_tag=0):
    """The device tables of the sources' rows (the history's table of row
    addresses, whose first `count` entries the read's kernels read) and of
    their gradients' rows, with the extra source and its gradient last
    where there is one (its entry or'ed with `extra_tag`: 1 asks an
    accumulating launch to write that row over)."""
    ops = _ops()
    if not plan.extra:
        return state._row_table, plan.grads_table
    device = plan.eager.device
    sources = ops._pointer_table(
        tuple(state._row_pointers[:count]) + (extra.data_ptr(),), device)
    if extra_grad is None:
        return sources, None
    return sources, ops._pointer_table(
        plan.grad_pointers + (extra_grad.data_ptr() | extra_tag,), device)


def _launch_forward(state, count, plan, extra, query, key_norm,
                    output_norm):
    ops = _ops()
    if extra is not None:
        extra = ops.dense(extra)
    sources, _ = _tables(state, count, plan, extra)
    o, lse, o_pre, residual = ops._launch_forward_from(
        plan.eager, sources, plan.dtype, query, key_norm, output_norm)
    kept = o if plan.eager.keeps_o else o_pre
    return o, (lse, kept, residual)


def _launch_backward(state, count, plan, extra, accumulate, query,
                     key_norm, output_norm, saved, grad_o, grads_table=None):
    """`grads_table`, where given, is the table of gradient rows in place of
    the read's own (a paired read's, with null entries)."""
    ops = _ops()
    lse, kept, residual = saved
    # The extra source's gradient starts in this launch: a writing backward
    # writes it, an accumulating one writes it over where its entry is
    # tagged (no zeros to fill and read back; _TAG_KERNEL_OPTIONS), and adds
    # into zeros with a bundle whose manifest does not say it takes tags.
    d_extra = None
    tagged = accumulate and plan.accumulating.writes_tagged_gradients
    if extra is not None:
        extra = ops.dense(extra)
        d_extra = torch.zeros_like(extra) if accumulate and not tagged \
            else torch.empty_like(extra)
    sources, grads = _tables(state, count, plan, extra, d_extra, int(tagged))
    if grads_table is not None:
        grads = grads_table
    launch = plan.accumulating if accumulate else plan.eager.backward
    dq, dg, dh = ops._launch_backward_into(
        plan.eager, launch, sources, grads, plan.dtype, query, key_norm,
        output_norm, grad_o, lse, kept, residual)
    return dq, dg, dh, d_extra
