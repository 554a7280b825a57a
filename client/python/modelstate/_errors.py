"""Errors: every failed call raises a ModelStateError carrying the gRPC
status code and the server's message. Subclasses also derive from the
Python exception PyTorch raises in the same situation, so code written
against torch.nn.Module catches them unchanged."""

import re

import grpc


class ModelStateError(RuntimeError):
    """A call failed. `code` is the grpc.StatusCode; str() is the server's
    message (PyTorch's own text where PyTorch has one)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self):
        return self.message


class NotFoundError(ModelStateError, LookupError):
    """No such module, path or entry (NOT_FOUND)."""


class AlreadyExistsError(ModelStateError, KeyError):
    """A module name in use, or PyTorch's "attribute 'x' already exists"
    (ALREADY_EXISTS; PyTorch raises KeyError there)."""


class InvalidArgumentError(ModelStateError, ValueError):
    """A malformed request; the message names the field (INVALID_ARGUMENT)."""


class InvalidNameError(InvalidArgumentError, KeyError):
    """A parameter, buffer or module name with a "." or an empty one
    (INVALID_ARGUMENT): PyTorch's register_* raise KeyError there."""


# The server's texts for those names, as PyTorch words them
# (core/module.cc): "parameter name can't contain "."", "module name can't
# be empty string """, ...
_NAME_ERROR = re.compile(r"^(parameter|buffer|module) name can't "
                         r"(contain \"\.\"|be empty string \"\")")


class DTypeError(ModelStateError, TypeError):
    """to() with a dtype that is not floating point (PyTorch's TypeError)."""


class FailedPreconditionError(ModelStateError):
    """A failed load_state_dict (PyTorch's RuntimeError text), a blocked
    registration, or a device the server does not have."""


_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
}


def from_rpc_error(error, invalid_argument=None):
    """The ModelStateError for a grpc.RpcError; `invalid_argument` picks
    another class for INVALID_ARGUMENT."""
    code = error.code()
    cls = _BY_CODE.get(code, ModelStateError)
    message = error.details() or str(code)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        if _NAME_ERROR.match(message):
            cls = InvalidNameError
        elif invalid_argument:
            cls = invalid_argument
    return cls(code, message)
