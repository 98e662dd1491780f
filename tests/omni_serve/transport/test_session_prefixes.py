from __future__ import annotations

import pytest
import torch

from omni_serve.transport import ChannelError, make_channel
from omni_serve.transport.kv_blocks import KVPrefix
from omni_serve.transport.session_prefixes import decode_prefix, free_prefix


async def test_freeing_a_prefix_hands_back_its_blocks_and_its_companion():
    channel = make_channel("shared_memory")
    blocks, rows = channel.put(torch.zeros(64)), channel.put(torch.ones(8))
    encoded = KVPrefix([1, 2, 3, 4], 4, blocks, companion=rows).encode()
    free_prefix(encoded)
    for ref in (blocks, rows):
        with pytest.raises(ChannelError):
            await channel.get(ref)
    free_prefix(encoded)  # a second free (a prefix already loaded) is harmless


@pytest.mark.parametrize("bad", [None, "", "not base64!"])
def test_an_unreadable_prefix_decodes_to_none(bad):
    assert decode_prefix(bad) is None
    free_prefix(bad)
