"""A slot-based KV cache: one row per running request, each at its own length.

This is what lets the torch engine batch decode steps of requests that started at different
times (continuous batching): a step writes each request's new K/V at that request's own
offset, and attention masks every row to its own length.
"""

from __future__ import annotations

import torch


class SlotKVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        spare_slot: bool = False,
    ) -> None:
        # A spare row is never allocated: a static-shape step points its padding rows at it.
        self.spare_slot = num_slots if spare_slot else None
        shape = (num_slots + int(spare_slot), num_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.device = torch.device(device)
        self.lengths = [0] * num_slots
        self.max_len = max_len
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV slot")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    def append(
        self, layer: int, slots: list[int], keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write [b, kvh, L, d] new K/V after each slot's length; return the slots' full K/V
        ([b, kvh, S, d], S = longest length after the write) and a [b, 1, L, S] bool mask
        that is causal within the new tokens and hides each row's padding."""
        new = keys.shape[2]
        starts = [self.lengths[s] for s in slots]
        if max(starts) + new > self.max_len:
            raise RuntimeError(f"sequence longer than the KV cache ({self.max_len})")
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            self.keys[layer][slot, :, start : start + new] = keys[row]
            self.values[layer][slot, :, start : start + new] = values[row]
        span = max(starts) + new
        # Gather only the live span: copying the whole max_len per layer was most of a step.
        device = self.device
        index = torch.tensor(slots, dtype=torch.long, device=device)
        k = self.keys[layer][:, :, :span].index_select(0, index)
        v = self.values[layer][:, :, :span].index_select(0, index)
        start_t = torch.tensor(starts, device=device).view(-1, 1, 1)
        query_pos = start_t + torch.arange(new, device=device).view(1, -1, 1)  # [b, L, 1]
        key_pos = torch.arange(span, device=device).view(1, 1, -1)  # [1, 1, S]
        mask = (key_pos <= query_pos).unsqueeze(1)  # [b, 1, L, S]
        return k, v, mask

    def advance(self, slots: list[int], n: int) -> None:
        """Commit ``n`` new tokens per slot once every layer has written them."""
        for slot in slots:
            self.lengths[slot] += n
