"""What a prefix is found by: a chain of block hashes over a prompt's token ids and the
digests of the media in it.

Block ``i``'s hash covers block ``i``'s tokens, the media items that start in it, and block
``i - 1``'s hash, so equal hashes at depth ``i`` mean equal prompts up to the end of block
``i`` (vLLM's prefix cache and LMCache key their blocks the same way). The chain is seeded
with the store's namespace, so prefixes of another model or KV layout never match.

These keys are in the ingress's terms (the ids it sends, media placeholders unexpanded where
the Thinker's engine expands them): they pick the kept prefix sharing the most with a prompt.
The engine checks the match again on its own ids and media before it loads a block
(``KVPrefix.matching_tokens``), so a key can never make a wrong block load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import blake3
import numpy as np
import torch

HASH_BYTES = 16


@dataclass(frozen=True)
class PromptContent:
    """A prompt as its prefix key sees it: token ids, and (offset, digest) per media item."""

    token_ids: list[int]
    media: list[tuple[int, str]] = field(default_factory=list)


def media_digest(item: object) -> str:
    """A media item's digest: its samples or pixels (an array, a tensor, an image, a list of
    frames), or its bytes."""
    if isinstance(item, (list, tuple)) or hasattr(item, "__array_interface__"):
        item = np.asarray(item)  # frames, or a PIL image
    if isinstance(item, torch.Tensor):
        item = item.detach().cpu().contiguous().numpy()
    if isinstance(item, np.ndarray):
        data = np.ascontiguousarray(item)
        head = f"{data.dtype.str}{data.shape}".encode()
        return blake3.blake3(head + data.tobytes()).hexdigest()[: 2 * HASH_BYTES]
    if isinstance(item, (bytes, bytearray, memoryview)):
        return blake3.blake3(bytes(item)).hexdigest()[: 2 * HASH_BYTES]
    raise TypeError(f"no digest for a {type(item).__name__}")


def block_hashes(content: PromptContent, block_tokens: int, namespace: str) -> list[str]:
    """The hash of each whole block of the prompt, chained (a partial last block has none)."""
    ids = np.asarray(content.token_ids, dtype=np.int64)
    media = sorted(content.media)
    whole = len(ids) - len(ids) % block_tokens
    previous = blake3.blake3(namespace.encode()).digest(HASH_BYTES)
    hashes, m = [], 0
    for start in range(0, whole, block_tokens):
        hasher = blake3.blake3(previous)
        hasher.update(ids[start : start + block_tokens].tobytes())
        while m < len(media) and media[m][0] < start + block_tokens:
            hasher.update(f"\0{media[m][0]}:{media[m][1]}".encode())
            m += 1
        previous = hasher.digest(HASH_BYTES)
        hashes.append(previous.hex())
    return hashes
