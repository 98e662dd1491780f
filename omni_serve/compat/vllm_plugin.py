"""``vllm.general_plugins`` entry point: vLLM calls it in every process it starts.

That is the one hook that reaches vLLM's spawned engine-core and worker processes, where the
Qwen3-Omni model file imports torchvision.
"""


def register() -> None:
    from omni_serve.compat import torchvision

    torchvision.install()
