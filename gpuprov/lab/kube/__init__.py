"""SIMULATION: an emulated Kubernetes API server with simulated controllers, for the lab.

Test infrastructure only (production code never imports gpuprov.lab). No kube-apiserver,
kubelet, kind or k3s can be installed on the project's machines, so this package serves the
Kubernetes REST API on 127.0.0.1 for the real `kubernetes` client, its DynamicClient,
Ansible's kubernetes.core modules and the real kubectl (Tables: printers.py; OpenAPI documents
built from the official schemas: openapi.py), validates every write against those schemas, and
simulates the scheduler, DaemonSet and Job controllers (controllers/), NVIDIA device plugin
registration and a kubelet per lab node (kubelet.py) that runs pods as containers in the
node's containerd through the CRI (cri.py). What it emulates and what it does not:
EMULATION.md next to this file.

Entry points: app.start_background / app.stop / app.url / app.write_kubeconfig (the lab CLI),
app.Emulator (in-process, tests), faults.set_fault / clear_fault / active_faults.
"""
