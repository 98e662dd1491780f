from __future__ import annotations

import pytest

from omni_serve.transport.base import ALIGN, size_class


@pytest.mark.parametrize("payload", [1 << 20, 16 << 20, 64 << 20, 256 << 20])
def test_a_power_of_two_payload_with_its_header_does_not_take_a_buffer_twice_its_size(payload):
    size = size_class(payload + ALIGN, minimum=1 << 20)
    assert payload + ALIGN <= size <= payload * 9 // 8 + 4096


def test_sizes_round_up_to_classes_that_nearby_payloads_share():
    assert size_class(100, minimum=1 << 20) == 1 << 20
    assert size_class(33 << 20, 1 << 20) == size_class(35 << 20, 1 << 20) == 36 << 20
    assert size_class(5000, minimum=0) == 8192  # page granularity at the bottom
