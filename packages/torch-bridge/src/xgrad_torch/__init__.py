"""A PyTorch PrivateUse1 device backed by xgrad tensors, registered from Python (no C++ extension).

    import torch, xgrad_torch            # registers the device `xgrad`
    model = Net().to("xgrad")            # or torch.device("xgrad:0"); also t.xgrad(), t.is_xgrad

Uses only the public `xgrad` API. `registration` holds the PrivateUse1 set-up (the only use of torch's private
APIs), `storage` the xgrad buffer on each torch storage and views of it, `ops` the aten table (its kernels written
in `ops`, `ops_activation`, `ops_memory` and `ops_nn`), `compile` the `torch.compile(backend="xgrad")` backend.
"""

from . import registration, storage

registration.register(storage.flush)

from . import ops, ops_activation, ops_memory, ops_nn  # noqa: E402 (the kernels register on the renamed device)

ops.install()

__version__ = "0.1.0"
__all__ = ["ops", "ops_activation", "ops_memory", "ops_nn", "registration", "storage"]
