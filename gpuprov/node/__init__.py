"""What runs on a node: the probe (probe/) and the MIG applier (mig_apply.py).

Shipped by folder: gpuprov/payload.py packs everything under gpuprov/node/ with the NVIDIA
facts it imports, and the gpuprov_node_state module's module_utils links this folder and
gpuprov/nvidia/. So code here imports only the standard library, gpuprov.nvidia and
gpuprov.node (pynvml lazily), relatively, and parses with the oldest Python the probe
supports (gpuprov.payload.MIN_PYTHON); tests/unit/test_package_layout.py holds it to that.
"""
