"""NVIDIA's facts: the GPU table, the driver branches and their lifecycle, the container
toolkit's advisories, MIG profiles and mig-parted's format, GPU Feature Discovery's labels.

Each module keeps its sources with the date they were read, in its docstring. Standard
library only (and each other): hardware.py runs on the nodes inside the probe, and the rest
are read by the roles' stages, by verify and by `gpuprov hw` alike
(tests/unit/test_package_layout.py holds the folder to that).
"""
