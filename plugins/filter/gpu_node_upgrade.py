"""The gpu_node_upgrade role's filters (gpuprov/stages/gpu_node_upgrade.py)."""

from gpuprov.stages.gpu_node_upgrade import *  # noqa: F403
from gpuprov.stages.gpu_node_upgrade import FilterModule  # noqa: F401
