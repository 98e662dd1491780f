"""Random-weight vocoders made to sound like speech, not a clamped square wave.

A vocoder's residual stack grows a signal many times over with fan-in init, and its output is
clamped to [-1, 1]: unscaled, random codes decode to silence or a saturated square wave. The
factories scale the last conv so that a fixed decode comes out at a speech-like loudness.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TARGET_AUDIO_RMS = 0.15


def scale_to_loudness(
    out_conv: torch.nn.Module, decode: Callable[[], object], target_rms: float = TARGET_AUDIO_RMS
) -> None:
    """Scale ``out_conv`` (weight and bias) so that its output during ``decode()`` has
    ``target_rms``. Measured on one thread, and the scale rounded to 3 significant digits, so
    float noise cannot change the checkpoint's bytes; ``decode`` must be deterministic (fixed
    codes, seeded noise)."""
    captured: list[torch.Tensor] = []
    handle = out_conv.register_forward_hook(lambda _m, _i, out: captured.append(out))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the measured rms must not depend on the thread count
    try:
        with torch.no_grad():
            decode()
    finally:
        handle.remove()
        torch.set_num_threads(threads)
    rms = captured[0].double().pow(2).mean().sqrt().item()
    scale = float(f"{target_rms / max(rms, 1e-12):.3g}")
    with torch.no_grad():
        out_conv.weight.mul_(scale)
        if out_conv.bias is not None:
            out_conv.bias.mul_(scale)
