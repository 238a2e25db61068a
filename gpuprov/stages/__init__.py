"""The roles' decisions, one module per Ansible role, named after it: roles/<role> calls them
through the filters of plugins/filter/<role>.py. They run on the controller only.

A module whose name starts with an underscore is a part that several stages share
(_node_read, _task_failure) or a large part of one (_runtime_config, _toolkit_config:
nvidia_container_toolkit's merges). tests/unit/test_package_layout.py keeps the roles, these
modules and the filter files in step.
"""
