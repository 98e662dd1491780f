"""The playground page's files (HTML, JS, CSS), served by ``omni_serve.api.playground``."""
