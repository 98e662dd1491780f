"""What a conversation keeps for its next spoken turn, so that the turn may skip its prefill.

A spoken reply to a prompt with media needs the Thinker's ``accept_hidden_layer`` rows at every
media position of the prompt (the Talker reads them there, and token embeddings everywhere
else: ``talker_inputs``). Rows of tokens served from a cache (the replica's prefix cache, or KV
handed over from another replica) are never computed, so such a turn would compute its whole
prompt. But a position's rows depend only on the tokens and media up to it: rows one turn
computed stay right for every later prompt of the conversation that starts with the same
tokens and media. So a spoken turn keeps its rows at media positions (``SessionRows``), and the
next spoken turn reads caches wherever those rows cover the cached media, and computes the
rest. Whether they cover it is known only once the engine says how many tokens it found
cached (``covers``); if they do not, the turn runs again without caches.

A Talker that reads the Thinker's rows at every position (Qwen2.5-Omni's, of its last layer)
needs them at every cached position, not only media ones: such a turn keeps ``everywhere``,
its prompt's rows and those of its reply's tokens, so that the next turn, whose prompt starts
with both, may read caches up to the end of that reply.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from omni_serve.transport.base import TensorRef


@dataclass
class SessionRows:
    """A spoken turn's rows at its prompt's media positions, kept for the next turn."""

    ids: list[int]  # the prompt as the Thinker ran it (media placeholders expanded)
    media: dict[str, list[str]]  # digests of its media items, per modality, in prompt order
    ref: TensorRef  # accept-layer rows at the kept positions of ``ids``, in position order
    placeholders: dict[str, int] = field(default_factory=dict)  # modality -> token id
    # Rows at every position of ``ids`` (the prompt, then its reply's tokens), not only media.
    everywhere: bool = False


def digest(item: Any) -> str:
    """A media item's identity: its content (array, tensor, image, or a tuple of them)."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, item)
    return h.hexdigest()


def _feed(h: Any, item: Any) -> None:
    if isinstance(item, torch.Tensor):
        h.update(str((item.dtype, tuple(item.shape))).encode())
        h.update(item.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    elif isinstance(item, np.ndarray):
        h.update(str((item.dtype, item.shape)).encode())
        h.update(np.ascontiguousarray(item).tobytes())
    elif isinstance(item, list | tuple):
        for part in item:
            _feed(h, part)
    elif hasattr(item, "tobytes") and hasattr(item, "size"):  # a PIL image
        h.update(str((getattr(item, "mode", ""), item.size)).encode())
        h.update(item.tobytes())
    else:
        h.update(repr(item).encode())


def item_starts(ids: list[int], token_id: int) -> list[int]:
    """Where each media item (a run of its placeholder) starts."""
    return [i for i, t in enumerate(ids) if t == token_id and (i == 0 or ids[i - 1] != token_id)]


def media_mask(ids: list[int], placeholders: dict[str, int]) -> torch.Tensor:
    return torch.isin(torch.tensor(ids), torch.tensor(list(placeholders.values())))


def kept_mask(ids: list[int], placeholders: dict[str, int], everywhere: bool) -> torch.Tensor:
    """The positions of ``ids`` whose rows a turn keeps."""
    if everywhere:
        return torch.ones(len(ids), dtype=torch.bool)
    return media_mask(ids, placeholders)


def covers(kept: SessionRows, ids: list[int], media: dict[str, list[str]], cached: int) -> bool:
    """Whether ``kept`` holds the rows of every media position (of every position, where it
    keeps them ``everywhere``) among the first ``cached`` tokens of this prompt (``ids``
    expanded, ``media`` its digests): those tokens and items must be the kept prompt's, and
    no media (no token at all, ``everywhere``) may lie in a cached part beyond it."""
    same = min(cached, len(kept.ids))
    if ids[:same] != kept.ids[:same] or (kept.everywhere and cached > len(kept.ids)):
        return False
    for modality, token_id in kept.placeholders.items():
        starts = [s for s in item_starts(ids, token_id) if s < cached]
        if any(s >= len(kept.ids) for s in starts):
            return False
        if media.get(modality, [])[: len(starts)] != kept.media.get(modality, [])[: len(starts)]:
            return False
    return True


def assemble(
    kept: SessionRows | None, kept_rows: torch.Tensor | None, captured: torch.Tensor, cached: int
) -> torch.Tensor:
    """Accept-layer rows of the whole prompt: kept rows at the cached media positions (at every
    cached position, ``everywhere``), captured rows (of positions ``cached`` onward) after
    them. Cached text positions a turn kept no rows for stay zero: the Talker reads token
    embeddings there."""
    full = captured.new_zeros(cached + captured.shape[0], captured.shape[1])
    full[cached:] = captured
    if kept is not None and kept_rows is not None and cached:
        mask = kept_mask(kept.ids, kept.placeholders, kept.everywhere)
        positions = mask.nonzero().flatten()
        take = positions < cached
        full[positions[take]] = kept_rows[take].to(full.dtype)
    return full


def rows_to_keep(
    ids: list[int], rows: torch.Tensor, placeholders: dict[str, int], everywhere: bool = False
) -> torch.Tensor:
    """A turn's accept-layer rows at its kept positions (what ``SessionRows.ref`` holds)."""
    return rows[: len(ids)][kept_mask(ids, placeholders, everywhere)].contiguous()


def media_digests(
    multi_modal_data: dict[str, Any] | None,
    spliced: list[tuple[int, str]] | None = None,
    encoded: dict[str, tuple[torch.Tensor, Any]] | None = None,
    merge_size: int = 2,
) -> dict[str, list[str]]:
    """Each media item's digest, per modality, in prompt order: raw media vLLM encodes, or an
    encoder stage's rows (audio rows spliced into the prompt; image and video rows, by
    modality with their grids, split per item)."""
    out: dict[str, list[str]] = {}
    raw = multi_modal_data or {}
    for modality in ("audio", "image", "video"):
        items = raw.get(modality)
        if items is not None and not isinstance(items, dict):  # a dict: precomputed embeddings
            out[modality] = [
                digest(item) for item in (items if isinstance(items, list) else [items])
            ]
    if spliced is not None:
        out["audio"] = [identity for _, identity in spliced]
    for modality, (rows, grid_thw) in (encoded or {}).items():
        grids = torch.as_tensor(grid_thw).tolist()
        sizes = [int(t * h * w) // merge_size**2 for t, h, w in grids]
        out[modality] = [digest(item_rows) for item_rows in rows.split(sizes)]
    return out
