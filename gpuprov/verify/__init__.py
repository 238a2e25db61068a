"""`gpuprov verify`: prove that every GPU node works, from NVML to the Kubernetes API.

    inventory.py     the Ansible inventory, read through Ansible -> Node records
    nodes.py         node phase: the probe on every node in parallel (one seam: probe_node)
    cluster.py       cluster phase: one LIST of nodes and one of pods -> ClusterView
    checks/          the checks, one module per family, each registered with its id,
                     severity, description and remediation (findings.CHECKS)
    runner.py        selects checks, evaluates them on the collected facts -> Findings
    report.py        table, JSON (schema_version 1), JUnit XML, and the exit code
"""
