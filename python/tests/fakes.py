"""Objects that look like torch tensors (shape, dtype, device, strides) for
testing the argument checks without PyTorch."""


class Device:
    def __init__(self, text):
        kind, _, index = text.partition(":")
        self.type = kind
        self.index = int(index) if index else None


class Dtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


class Tensor:
    def __init__(self, shape, dtype="bfloat16", device="cuda:0"):
        self.shape = tuple(shape)
        self.dtype = Dtype(dtype)
        self.device = Device(device)

    def stride(self):
        strides, step = [], 1
        for extent in reversed(self.shape):
            strides.insert(0, step)
            step *= extent
        return tuple(strides)

    def data_ptr(self):
        return 1 << 20
