"""modelstate: a Python client for modelstate-server, shaped like PyTorch.

    import modelstate, torch
    ms = modelstate.connect("127.0.0.1:50051")
    remote = ms.push(model, "team/model")   # a torch nn.Module, hosted
    model2 = ms.pull("team/model")          # a torch nn.Module again

    m = ms.build({"type": "Linear", "args": [4, 2]}, "team/lin", seed=0)
    sd = m.state_dict()                    # OrderedDict of torch.Tensor
    m.load_state_dict(sd, strict=True)     # <All keys matched successfully>
    m.to(dtype=torch.float16)

    def no_temp(module, name, buffer):
        if name == "temp_buffer":
            return modelstate.REJECT       # block the registration
    handle = ms.register_module_buffer_registration_hook(no_temp)
    handle.remove()
"""

from ._errors import (AlreadyExistsError, DTypeError, FailedPreconditionError,
                      InvalidArgumentError, InvalidNameError, ModelStateError,
                      NotFoundError)
from ._hooks import REJECT, HookHandle, ModuleRef
from ._order import record_construction
from ._pull import PullNote
from ._push import PushNote
from ._remote import RemoteModule
from .client import Client, connect

__version__ = "0.2.0"

__all__ = [
    "AlreadyExistsError", "Client", "DTypeError", "FailedPreconditionError",
    "HookHandle", "InvalidArgumentError", "InvalidNameError",
    "ModelStateError", "ModuleRef", "NotFoundError", "PullNote", "PushNote",
    "REJECT", "RemoteModule", "connect",
    "record_construction",
]
