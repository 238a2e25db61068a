"""SIMULATION: the lab's NVIDIA container toolkit (gpuprov/lab/SIMULATION.md).

The stand-in programs (files without .py: nvidia-ctk, nvidia-container-runtime, ...) and the
Python modules they share (toolkit_rules: which GPUs a container gets, by NVIDIA's rules;
simnvml_client: the node's GPUs through NVML) are packaged by gpuprov/lab/pkgrepo.py; the
modules go to /usr/lib/gpuprov-sim/python on the nodes. The lab's kubelet imports the same
toolkit_rules from here, so the rules exist once.
"""
