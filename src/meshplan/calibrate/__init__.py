"""``meshplan calibrate``: measure kernels and collectives on the user's hardware, fit a profile.

The measuring modules (``kernels``, ``collectives``, ``timing``, ``power``) import PyTorch (and
``power`` NVML's nvidia-ml-py) lazily, only while they run; ``shapes``, ``table``, ``fit`` and
``fit_power`` need numpy alone (``fit_kernels`` imports scipy
while it runs), so the fitter also runs on measurements taken elsewhere (``../shared/calibration/h100-sxm/``). The files written carry the
same columns as that shipped H100 directory, so one fitter reads either.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError


def require_torch():
    """The torch module, or one error line naming the extra that installs it."""
    try:
        import torch
    except ImportError:
        raise MeshplanError("calibrate", "torch", "install the calibrate extra: pip install 'meshplan[calibrate]'") from None
    return torch
