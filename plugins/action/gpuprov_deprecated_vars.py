"""Action: warn, the way Ansible warns about its own deprecated features, about settings given
under a name that was replaced.

    - name: Warn about settings under their deprecated names
      gpuprov_deprecated_vars:
        renamed: {upgrade_drain_timeout: gpu_node_upgrade_drain_timeout}
        until: "0.3.0"

For each old name that is set anywhere (inventory, extra vars, play vars), Display.deprecated:
the message is the same on every host, so Ansible shows it once per run however many hosts and
batches run the task, `deprecation_warnings = False` silences it as it silences Ansible's own,
and callbacks get it in the task's result (`deprecations`). The role keeps reading the old name
(its defaults/main.yml falls back to it); the new name wins where both are set. Returns
{"deprecated": {old: new}} for the old names that are set.

An action, not a module: it only reads the run's variables, on the controller.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        _, args = self.validate_argument_spec(argument_spec={
            "renamed": {"type": "dict", "required": True},
            "until": {"type": "str", "required": True},
        })
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        deprecated = {str(old): str(new) for old, new in args["renamed"].items()
                      if old in task_vars}
        for old, new in sorted(deprecated.items()):
            # No help_text: ansible-core 2.18 (ansible 11) has no such argument.
            display.deprecated(
                f"The setting {old} is deprecated: rename it {new} in the inventory or the -e "
                f"option. {old} is read until gpuprov {args['until']}; where both are set, "
                f"{new} wins",
                version=args["until"],
            )
        result.update(changed=False, deprecated=deprecated)
        return result
