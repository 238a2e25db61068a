"""The node probe: what a node has, as one JSON document. Read-only, fast, never raises.

It runs on nodes that have only python3 >= 3.9 (Debian 11+, Ubuntu 22.04+, RHEL 9+;
RHEL 8's platform python 3.6 is not supported: install python39 there), shipped by
gpuprov/payload.py together with gpuprov/nvidia/hardware.py and pynvml. So this package
imports only the standard library, gpuprov.nvidia.hardware, and pynvml (lazily).
Entry points: ``gpuprov.node.probe.report.collect(root="/") -> dict`` and
``python3 -m gpuprov.node.probe``. The roles' own reads of a node (packages, modules, units, the
files they write) are ``gpuprov.node.probe.node_state.read``, which Ansible ships to nodes as
the gpuprov_node_state module's module_utils (plugins/modules/gpuprov_node_state.py).
Hence relative imports inside gpuprov/node and nothing imported here: the package works
both as ``gpuprov.node.probe`` and as ``ansible.module_utils.gpuprov.node.probe``, and the module
carries only the files it imports.

Errors are data: an NVML failure is {"code": int, "name": "NVML_ERROR_...",
"message": str}; a failed query of one GPU field goes into that GPU's "errors"
map keyed by the field (e.g. "remapped_rows", "temperature.slowdown"), and the
field is null. A node without NVIDIA PCI devices gives pci == [] and, typically,
nvml.available == false with NVML_ERROR_LIBRARY_NOT_FOUND: that is "no GPU", not
a failure.

Schema (schema_version 1; keys are always present, values may be null):

    schema_version  1
    probe           version (gpuprov), root, collected_at (unix time), duration_s,
                    errors {section: {type, message, where}} (a section that crashed)
    host            hostname, os {id, id_like, version_id, version_codename,
                    pretty_name} (from /etc/os-release), kernel (release), machine,
                    boot_id, python
    pci             [ NVIDIA display controllers (class 0x03xxxx) on the PCI bus:
                      address "0000:3b:00.0", device_id "10de:15f8", class "0x030200",
                      subsystem_id "10de:118f", revision, numa_node (-1: none),
                      link {current_speed "8.0 GT/s PCIe", current_gen, current_width,
                            max_speed, max_gen, max_width},
                      driver (bound kernel driver, e.g. "nvidia"),
                      pci_ids_name (the node's pci.ids name, read only for a device
                      gpuprov's table lacks: "GH100 [H100]"),
                      classification (gpuprov.nvidia.hardware.classify(...).to_dict()),
                      classification_error ]
    nvml            available, error, library {path, version (from the file name of
                    the loaded libnvidia-ml, i.e. the user-space driver version)},
                    driver_version (the kernel driver's, as NVML reports it),
                    cuda_driver_version "12.2", cuda_driver_version_int 12020,
                    nvml_version "12.535.104.05", device_count, errors {field: error},
                    gpus [ index, error (handle failure, e.g. NVML_ERROR_GPU_IS_LOST:
                           then no other keys), name, uuid, serial, minor_number,
                           pci_bus_id "00000000:3B:00.0", pci_device_id "10de:15f8",
                           pci_subsystem_id, memory {total, used, free, reserved}
                           (bytes; NVML's v2 reading, as nvidia-smi's: "used"
                           leaves out what the driver reserves; reserved None
                           where only v1 answered, whose "used" includes it),
                           compute_capability "6.0", architecture_nvml (int),
                           architecture (GPU Feature Discovery name, e.g. "pascal"),
                           brand_nvml (int, nvmlBrandType),
                           temperature {current, slowdown, shutdown} (C),
                           utilization {gpu, memory} (%), power {usage_w, limit_w},
                           persistence_mode, ecc {mode_current, mode_pending,
                             volatile {corrected, uncorrected},
                             aggregate {corrected, uncorrected}},
                           retired_pages {sbe, dbe, pending} | null (not supported),
                           remapped_rows {correctable, uncorrectable, pending,
                             failure} | null (not supported),
                           clock_event_reasons {mask, names ["hw_thermal_slowdown",
                             ...]}, pcie {gen_current, gen_max, width_current,
                             width_max}, processes [{pid, used_memory}],
                           mig {current, pending (MIG mode), devices [{index, uuid,
                             name, profile "1g.10gb", gpu_instance_id,
                             compute_instance_id, memory_mb, multiprocessors,
                             gpu_instance_slices, compute_instance_slices, engines
                             {copy, decoder, encoder, jpeg, ofa}}]} | null
                             (no MIG on this GPU),
                           errors {field: error} ]
    kernel_module   loaded, version (/sys/module/nvidia/version, else
                    /proc/driver/nvidia/version), flavor "open" | "proprietary" |
                    null (unknown), proc_version (first line), modules {nvidia,
                    nvidia_uvm, nvidia_modeset, nvidia_drm, nouveau: loaded?},
                    nouveau_loaded, nouveau_blacklisted_in [modprobe.d files]
    kernel_log      readable, source "/dev/kmsg", error, xid_count,
                    xid_events [{pci "0000:3b:00", xid, message, usec_since_boot,
                      gpu_instance, compute_instance (MIG; null without)}]
                    (first 100 since boot)
    packages        manager "dpkg" | "rpm" | null, error,
                    driver [{name, version, state, held}] (nvidia*, libnvidia*,
                      libcuda*, cuda*, kmod-/dkms-/firmware-nvidia*),
                    cuda_toolkit [same shape] (a CUDA toolkit installed on the host),
                    runtime [same shape] (containerd, cri-o, docker-ce/docker.io)
    container_runtime
                    containerd {present, files [{path, error}] (load order),
                      import_merge (replace-plugin-tables | deep), version, runtimes
                      {name: {runtime_type, binary}}, default_runtime_name,
                      nvidia_runtime, default_is_nvidia, enable_cdi (null: not set),
                      cdi_spec_dirs (null: not set)} (imports applied as containerd does),
                    docker {present, error, runtimes {name: {binary}},
                      default_runtime_name, nvidia_runtime, default_is_nvidia},
                    crio {present, files, runtimes, default_runtime_name,
                      nvidia_runtime, default_is_nvidia},
                    binaries {nvidia-container-runtime, nvidia-ctk, ...: path | null},
                    cdi_specs [{path, kind, error, devices [names], driver_versions
                      [the x.y.z of the driver libraries it mounts]}],
                    sockets {containerd, docker, crio}
    boot            kernels [/boot images], running_kernel, next_kernel (the newest image),
                    modules {release: {path, kind "dkms" | "packaged", version, signer,
                      sig_key, signed, error} | null}, secure_boot (null: no EFI variable),
                    trusted_keys [asymmetric key descriptions] (gpuprov/node/probe/boot.py)
    summary         pci_gpu_count, nvml_gpu_count, nvml_healthy_gpu_count, gpu_node

"nvidia_runtime" means a runtime named "nvidia" whose binary is
nvidia-container-runtime (or its .cdi/.legacy variant).
"""
