"""The request bookkeeping a ``StepRunner`` shares when its requests hold a slot of a
``SlotKVCache`` and are fed one trailing row per decode step while they run (a Talker
following its Thinker): feeding, readiness, admission, suppressed tokens and release.

A subclass sets ``self.cache`` (the ``SlotKVCache``) and ``self._suppress`` (token ids the
sampler never picks); its per-request state has ``trailing`` (a deque of rows),
``text_done`` and ``slot``.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_serve.engines.ar.kv_cache import SlotKVCache


class FedSlotRunner:
    cache: SlotKVCache
    _suppress: torch.Tensor

    def feed(self, state: Any, item: torch.Tensor | None) -> None:
        """``item``: a trailing row, or None when the text it follows has ended."""
        if item is None:
            state.text_done = True
        else:
            state.trailing.append(item)

    def ready(self, state: Any) -> bool:
        return bool(state.trailing) or state.text_done

    def can_admit(self) -> bool:
        return self.cache.free_slots > 0

    def suppress_tokens(self, state: Any) -> torch.Tensor:
        return self._suppress

    def release(self, state: Any) -> None:
        if state.slot is not None:
            self.cache.release(state.slot)
            state.slot = None
