"""gemm-dispatcher inside PyTorch models (docs/pytorch.md).

Importing this package registers the `gemm_dispatcher::*` operators with
torch (eager, fake tensors for torch.compile, autograd); `import dispatcher`
alone never imports torch. Needs `pip install 'gemm-dispatcher[torch]'`.
"""

try:
    import torch
except ImportError as e:
    raise ImportError("dispatcher.torch needs PyTorch: pip install 'gemm-dispatcher[torch]'") from e
if not hasattr(torch.library, "register_fake"):
    raise ImportError(f"dispatcher.torch needs torch >= 2.4 (torch.library.custom_op and "
                      f"register_fake); this is torch {torch.__version__}")

from dispatcher.torch.linear import Linear, swap_linears
from dispatcher.torch.ops import config_key, gemm, grouped_mm

__all__ = ["Linear", "config_key", "gemm", "grouped_mm", "swap_linears"]
