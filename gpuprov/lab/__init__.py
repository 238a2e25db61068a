"""gpuprov's lab: test infrastructure and SIMULATION, never imported by production code.

Debian 12 and 13 nodes in podman containers on one machine, with simulated GPU
hardware (a PCI sysfs tree and an NVML library: profiles.py, faults.py, simhw.py,
nvml/simnvml.c) and an emulated Kubernetes API. What is simulated, and what the
simulation does not do, is written down in SIMULATION.md next to this file.
Code outside gpuprov/lab/ must not import from here: production code meets the
simulation only the way it meets real hardware, through sysfs and libnvidia-ml.so.1.
"""
