"""The exceptions of the attnres package."""


class AttnresError(RuntimeError):
    """Base class of every attnres error."""


class LibraryNotFoundError(AttnresError, ImportError):
    """A shared library of attnres cannot be found or loaded."""


class CompileError(AttnresError):
    """The compiler refused a spec, module or option (its message says why)."""


class InvalidArgumentError(AttnresError, ValueError):
    """A call was given a wrong value (the message names it)."""


class BundleError(AttnresError):
    """A bundle folder is missing, unreadable or malformed."""


class NoDriverError(AttnresError):
    """The CUDA driver or HIP runtime is not present on this machine."""


class DriverError(AttnresError):
    """The GPU driver reported an error."""
