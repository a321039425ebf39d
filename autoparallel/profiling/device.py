"""Which device a profile runs on, and the name it is recorded under.

``--device auto`` (the default) measures on the GPU when torch sees one and on the CPU
otherwise; ``cuda`` insists on a GPU, ``cpu`` on the CPU. Every measurement records
``device_name`` of the device that took it (in profiled.csv and the layer-profile store), so a
CPU figure is never read as a GPU one.
"""

from __future__ import annotations

import os
import platform

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(choice: str = "auto") -> str:
    """'cpu' or 'cuda' for a ``--device`` value; ValueError naming the problem otherwise."""
    import torch
    if choice not in DEVICE_CHOICES:
        raise ValueError(f"--device {choice!r} is not valid; choose one of "
                         f"{', '.join(DEVICE_CHOICES)}")
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA GPU here "
                         f"(torch {torch.__version__}); use --device cpu or auto")
    return choice


def device_name(device: str = "cpu") -> str:
    """'NVIDIA H100 80GB HBM3' for a CUDA device, 'cpu:x86_64:2' (arch, cores) for the CPU."""
    import torch
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu:{platform.processor() or platform.machine()}:{os.cpu_count()}"
