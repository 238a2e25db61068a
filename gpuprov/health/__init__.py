"""gpuprov health on the controller: the fleet's gpuprov.io/ conditions (fleet.py) and remediation
(remediate.py). The node agent is gpuprov/node/health/."""
