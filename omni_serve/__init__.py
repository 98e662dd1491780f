"""omni-serve: omni-modal models served as graphs of Ray Serve deployments.

Importing the package makes torchvision importable on CPU-only torch first (transformers and
vLLM import it deep inside); see ``omni_serve.compat.torchvision``.
"""

from omni_serve.compat import torchvision as _torchvision_compat

_torchvision_compat.install()

__version__ = "0.1.0"
