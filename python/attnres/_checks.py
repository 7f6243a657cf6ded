"""Argument checks of the PyTorch ops, written against what a tensor shows
(shape, dtype, device, strides) rather than against torch itself, so that
every message can be tested on a machine without PyTorch or a GPU."""

import math

from .errors import InvalidArgumentError

# torch dtype name -> attnres element type
VALUE_TYPES = {"torch.bfloat16": "bf16", "torch.float16": "f16",
               "torch.float32": "f32"}
MAX_QUERIES = 16


class TensorShape:
    """Looks like a CUDA tensor of `shape` and `dtype` (a torch dtype, or
    its name: "torch.bfloat16") to the checks below: a call's Call, and so
    the kernels it will need, without PyTorch or a GPU (listing the bundles
    to prebuild)."""

    class _Device:
        type, index = "cuda", 0

    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.device = tuple(shape), dtype, \
            self._Device

    def stride(self):
        return ()

    def data_ptr(self):
        return 0


def _dtype(tensor):
    return str(tensor.dtype)


def _shape(tensor):
    return tuple(int(d) for d in tensor.shape)


def _device(tensor):
    device = tensor.device
    return f"{device.type}:{device.index}" if device.index is not None \
        else device.type


def _is_tensor(value):
    return all(hasattr(value, a) for a in ("shape", "dtype", "device",
                                           "stride", "data_ptr"))


def _need_tensor(value, name):
    if not _is_tensor(value):
        raise TypeError(f"{name} must be a torch.Tensor, got "
                        f"{type(value).__name__}")


def _check_eps(eps):
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or \
            not math.isfinite(eps) or eps <= 0:
        raise InvalidArgumentError(
            f"eps must be a finite number > 0, got {eps!r}")


class Call:
    """A checked attnres call: the static shape the kernels are compiled
    for, and how to lay the tensors out for them."""

    def __init__(self, **fields):
        # setattr, not __dict__.update: torch.compile traces this.
        for name, value in fields.items():
            setattr(self, name, value)

    def spec(self, partial=False, fp32_output=False, accumulate=False):
        """The compiler spec (docs/Bundle.md) of the forward and backward;
        with `partial`, of the partial result (FP32 o and its lse, no output
        norm) and its backward, which takes the lse's gradient too; with
        `fp32_output`, of an FP32 o (and o_pre), whose backward takes an
        FP32 output gradient and saved o_pre; with `accumulate`, whose
        backward adds into the source gradients it is given."""
        items = [f"L={self.L}", f"D={self.D}", f"R={self.R}", f"M={self.M}",
                 f"dtype={self.value_type}", "multi_query"]
        if accumulate:
            items.append("accumulate")
        if partial or fp32_output:
            items.append("output_dtype=f32")
        if partial:
            items.append("grad_lse")
        if self.param_type != self.value_type:
            items.append(f"param_dtype={self.param_type}")
        if self.key_norm:
            items.append("key_norm")
        if self.output_norm:
            items.append("output_norm=per_query" if self.per_query
                         else "output_norm")
        # An FP32 partial o is saved whole: no residual to keep.
        save = "o_pre_residual" if self.residual and not partial and \
            not fp32_output else self.save
        items += [f"save={save}", f"eps={self.eps!r}",
                  f"scale={self.scale!r}"]
        return "train:" + ",".join(items)


def keeps_residual(dtype, width, save):
    """Whether save="o_pre" also keeps the 4-bit residual of o_pre's
    rounding (two a byte), so that the gradients are as accurate as with an
    FP32 o_pre (docs/Python.md): for 16-bit values (`dtype` a torch dtype or
    its name) and an even width."""
    return save == "o_pre" and VALUE_TYPES.get(str(dtype)) in ("bf16", "f16") \
        and width % 2 == 0


def check_attnres(sources, query, key_norm_weight, output_norm_weight, eps,
                  scale, save, *, cuda_available=True, any_device=False):
    """Checks the arguments of attnres.attnres; returns a :class:`Call` or
    raises TypeError / InvalidArgumentError naming the argument and rule.
    `any_device`: the tensors may be on any one device (a caller with an
    implementation for the CPU), not only a GPU."""
    if _is_tensor(sources):
        packed = True
        shape = _shape(sources)
        if len(shape) < 3:
            raise InvalidArgumentError(
                f"packed sources must be [L, ..., D] with at least one token "
                f"dimension, got shape {list(shape)}")
        L, lead, D = shape[0], shape[1:-1], shape[-1]
        tensors = [("sources", sources)]
    elif isinstance(sources, (list, tuple)):
        packed = False
        if not sources:
            raise InvalidArgumentError("attnres needs at least one source")
        for index, source in enumerate(sources):
            _need_tensor(source, f"sources[{index}]")
        first = _shape(sources[0])
        if len(first) < 2:
            raise InvalidArgumentError(
                f"each source must be [..., D] with at least one token "
                f"dimension, got shape {list(first)} for sources[0]")
        for index, source in enumerate(sources[1:], 1):
            if _shape(source) != first:
                raise InvalidArgumentError(
                    f"sources must all have one shape: sources[0] is "
                    f"{list(first)}, sources[{index}] is "
                    f"{list(_shape(source))}")
            if _dtype(source) != _dtype(sources[0]):
                raise InvalidArgumentError(
                    f"sources must all have one dtype: sources[0] is "
                    f"{_dtype(sources[0])}, sources[{index}] is "
                    f"{_dtype(source)}")
        L, lead, D = len(sources), first[:-1], first[-1]
        tensors = [(f"sources[{i}]", s) for i, s in enumerate(sources)]
    else:
        raise TypeError(f"sources must be a list of tensors or one packed "
                        f"[L, ..., D] tensor, got {type(sources).__name__}")

    value_dtype = _dtype(tensors[0][1])
    if value_dtype not in VALUE_TYPES:
        raise InvalidArgumentError(
            f"sources must be bfloat16, float16 or float32, got "
            f"{value_dtype}")
    if D < 1:
        raise InvalidArgumentError(f"the source width D must be >= 1, got {D}")

    _need_tensor(query, "query")
    q_shape = _shape(query)
    if len(q_shape) not in (1, 2):
        raise InvalidArgumentError(
            f"query must be [R] or [M, R], got shape {list(q_shape)}")
    M, R = (1, q_shape[0]) if len(q_shape) == 1 else q_shape
    if not 1 <= M <= MAX_QUERIES:
        raise InvalidArgumentError(
            f"query has M = {M} queries; attnres takes 1 to {MAX_QUERIES}")
    if not 1 <= R <= D:
        raise InvalidArgumentError(
            f"query rank R = {R} must be in [1, D = {D}] (the key is the "
            f"last R coordinates of a source)")
    param_dtype = _dtype(query)
    if param_dtype not in (value_dtype, "torch.float32"):
        raise InvalidArgumentError(
            f"query must have the sources' dtype ({value_dtype}) or "
            f"float32, got {param_dtype}")
    tensors.append(("query", query))

    if key_norm_weight is not None:
        _need_tensor(key_norm_weight, "key_norm_weight")
        if _shape(key_norm_weight) != (R,):
            raise InvalidArgumentError(
                f"key_norm_weight must be [R] = [{R}], got "
                f"{list(_shape(key_norm_weight))}")
        if _dtype(key_norm_weight) != param_dtype:
            raise InvalidArgumentError(
                f"key_norm_weight must have the query's dtype "
                f"({param_dtype}), got {_dtype(key_norm_weight)}")
        tensors.append(("key_norm_weight", key_norm_weight))
    per_query = False
    if output_norm_weight is not None:
        _need_tensor(output_norm_weight, "output_norm_weight")
        h_shape = _shape(output_norm_weight)
        per_query = len(h_shape) == 2
        if h_shape != (D,) and not (len(q_shape) == 2 and h_shape == (M, D)):
            allowed = f"[D] = [{D}]" + (f" or [M, D] = [{M}, {D}]"
                                        if len(q_shape) == 2 else "")
            raise InvalidArgumentError(
                f"output_norm_weight must be {allowed}, got {list(h_shape)}")
        if _dtype(output_norm_weight) != param_dtype:
            raise InvalidArgumentError(
                f"output_norm_weight must have the query's dtype "
                f"({param_dtype}), got {_dtype(output_norm_weight)}")
        tensors.append(("output_norm_weight", output_norm_weight))

    _check_eps(eps)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
            not math.isfinite(scale):
        raise InvalidArgumentError(
            f"scale must be a finite number, got {scale!r}")
    if save not in ("o_pre", "lse"):
        raise InvalidArgumentError(
            f"save must be 'o_pre' (keep the output before its norm: the "
            f"backward reads each source once) or 'lse' (recompute: less "
            f"memory), got {save!r}")

    check_devices(tensors, cuda_available, any_device)
    tokens = 1
    for extent in lead:
        tokens *= extent
    return Call(residual=keeps_residual(value_dtype, D, save), L=L, D=D, R=R,
                M=M, N=tokens, lead=tuple(lead), packed=packed,
                multi_query=len(q_shape) == 2,
                value_type=VALUE_TYPES[value_dtype],
                param_type=VALUE_TYPES[param_dtype],
                key_norm=key_norm_weight is not None,
                output_norm=output_norm_weight is not None,
                per_query=per_query, eps=float(eps), scale=float(scale),
                save=save)


def _row_major_strides(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.insert(0, step)
        step *= extent
    return tuple(strides)


def check_gradient_buffer(sources, grad_sources):
    """The buffer a *_into backward writes the source gradients into (a
    residual history's gradient rows): dense [L, N, D] in the sources'
    dtype, on their device, 16-byte aligned; the kernel writes it row by
    row with no strides, so a view with gaps would be written wrong, and
    it refuses (skips) a misaligned launch, which would leave the buffer
    unwritten."""
    first = sources[0]
    L = len(sources) if len(_shape(first)) == 2 else _shape(first)[0]
    expected = (L,) + _shape(first)[-2:]
    got = _shape(grad_sources)
    dense = all(stride == step for stride, step, extent in
                zip(grad_sources.stride(), _row_major_strides(got), got)
                if extent > 1)
    aligned = not grad_sources.data_ptr() & 15
    if got != expected or _dtype(grad_sources) != _dtype(first) or \
            _device(grad_sources) != _device(first) or not dense or \
            not aligned:
        layout = "" if got != expected else \
            " (not dense)" if not dense else \
            " (not 16-byte aligned)" if not aligned else ""
        raise InvalidArgumentError(
            f"grad_sources must be a dense, 16-byte aligned "
            f"{list(expected)} {_dtype(first)} tensor on {_device(first)}, "
            f"got {list(got)} "
            f"{_dtype(grad_sources)} on {_device(grad_sources)}{layout}")


def check_devices(tensors, cuda_available=True, any_device=False):
    """Every tensor on one GPU (on one device, with `any_device`)."""
    first_name, first = tensors[0]
    if first.device.type != "cuda" and not any_device:
        hint = "" if cuda_available else \
            " (and this PyTorch sees no CUDA or ROCm GPU)"
        raise InvalidArgumentError(
            f"{first_name} is on {_device(first)}; attnres runs on CUDA or "
            f"ROCm GPUs: move the tensors there with .cuda(){hint}")
    for name, tensor in tensors[1:]:
        if _device(tensor) != _device(first):
            raise InvalidArgumentError(
                f"{name} is on {_device(tensor)} but {first_name} is on "
                f"{_device(first)}: every tensor must be on one device")


def check_partition_reduce(partials, lse, sink, output_norm_weight, eps,
                           mode, *, cuda_available=True):
    """Checks the arguments of attnres.partition_reduce."""
    if mode not in ("softmax", "sum"):
        raise InvalidArgumentError(
            f"mode must be 'softmax' or 'sum', got {mode!r}")
    _need_tensor(partials, "partials")
    shape = _shape(partials)
    if _dtype(partials) != "torch.float32":
        raise InvalidArgumentError(
            f"partials must be float32 (partial results are FP32), got "
            f"{_dtype(partials)}")
    tensors = [("partials", partials)]
    if mode == "sum":
        if len(shape) < 2:
            raise InvalidArgumentError(
                f"partials of a sum must be [P, ...], got {list(shape)}")
        for name, value in (("lse", lse), ("sink", sink),
                            ("output_norm_weight", output_norm_weight)):
            if value is not None:
                raise InvalidArgumentError(
                    f"{name} is only for mode='softmax'")
        check_devices(tensors, cuda_available)
        return Call(mode="sum", P=shape[0], shape=shape[1:])
    if len(shape) < 3:
        raise InvalidArgumentError(
            f"partials of a softmax merge must be [P, ..., D], got "
            f"{list(shape)}")
    P, lead, D = shape[0], shape[1:-1], shape[-1]
    if lse is None:
        raise InvalidArgumentError(
            "a softmax merge needs the partials' lse [P, ...]")
    _need_tensor(lse, "lse")
    if _shape(lse) != shape[:-1] or _dtype(lse) != "torch.float32":
        raise InvalidArgumentError(
            f"lse must be float32 {list(shape[:-1])} (partials without D), "
            f"got {_dtype(lse)} {list(_shape(lse))}")
    tensors.append(("lse", lse))
    if sink is not None:
        _need_tensor(sink, "sink")
        if _shape(sink) != tuple(lead) or _dtype(sink) != "torch.float32":
            raise InvalidArgumentError(
                f"sink must be float32 {list(lead)}, got {_dtype(sink)} "
                f"{list(_shape(sink))}")
        tensors.append(("sink", sink))
    out_type = "f32"
    if output_norm_weight is not None:
        _need_tensor(output_norm_weight, "output_norm_weight")
        if _shape(output_norm_weight) != (D,):
            raise InvalidArgumentError(
                f"output_norm_weight must be [D] = [{D}], got "
                f"{list(_shape(output_norm_weight))}")
        if _dtype(output_norm_weight) not in VALUE_TYPES:
            raise InvalidArgumentError(
                f"output_norm_weight must be bfloat16, float16 or float32, "
                f"got {_dtype(output_norm_weight)}")
        out_type = VALUE_TYPES[_dtype(output_norm_weight)]
        tensors.append(("output_norm_weight", output_norm_weight))
    _check_eps(eps)
    check_devices(tensors, cuda_available)
    rows = 1
    for extent in lead:
        rows *= extent
    return Call(mode="softmax", P=P, D=D, lead=tuple(lead), rows=rows,
                sink=sink is not None, output_norm=output_norm_weight
                is not None, out_type=out_type, eps=float(eps))
