"""gpuprov: provision mixed-generation NVIDIA GPU nodes for Kubernetes and verify them."""

__version__ = "0.1.0"
