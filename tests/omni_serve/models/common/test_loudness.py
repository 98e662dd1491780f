"""A random vocoder's last conv scaled so a fixed decode comes out at the target loudness,
the same scale whatever the thread count (the checkpoint's bytes must not depend on it)."""

from __future__ import annotations

import torch

from omni_serve.models.common.loudness import scale_to_loudness


def loud_conv() -> tuple[torch.nn.Conv1d, torch.Tensor]:
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(8, 1, 3, padding=1)
    conv.weight.data.mul_(40.0)  # a signal grown far past [-1, 1]
    return conv, torch.randn(1, 8, 480, generator=torch.Generator().manual_seed(1))


def test_the_decode_comes_out_at_the_target_rms_and_the_threads_are_restored():
    conv, x = loud_conv()
    threads = torch.get_num_threads()
    scale_to_loudness(conv, lambda: conv(x), target_rms=0.15)
    with torch.no_grad():
        rms = conv(x).pow(2).mean().sqrt().item()
    assert abs(rms - 0.15) < 0.15 * 0.01  # the scale keeps 3 significant digits
    assert torch.get_num_threads() == threads


def test_the_scale_does_not_depend_on_the_thread_count():
    threads, scaled = torch.get_num_threads(), []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            conv, x = loud_conv()
            scale_to_loudness(conv, lambda conv=conv, x=x: conv(x))
            scaled.append(conv.weight.detach().clone())
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(scaled[0], scaled[1])
