"""gpuprov/cordon.py: the Node patches of a recorded cordon, applied as the API server applies
a merge patch (RFC 7386: null removes a key), so that each case runs take -> give_back (or
failed) on one Node and checks the Node that results, not only the patch."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pytest

from gpuprov import cordon

NOW = datetime(2026, 11, 26, 18, 0, 5, tzinfo=timezone.utc)
UPGRADE, MIG, HEALTH = "gpu-node-upgrade", "gpu-mig", "health-remediate"


def apply(node: dict, patch: dict) -> dict:
    """RFC 7386 merge patch, as the API server applies `kubectl patch --type merge`."""
    out = copy.deepcopy(node)

    def merge(target: dict, change: dict) -> None:
        for key, value in change.items():
            if value is None:
                target.pop(key, None)
            elif isinstance(value, dict):
                if not isinstance(target.get(key), dict):
                    target[key] = {}
                merge(target[key], value)
            else:
                target[key] = value
    merge(out, patch)
    return out


def node(cordoned: bool = False, **annotations: str) -> dict:
    return {"metadata": {"name": "gpu-a", "annotations": dict(annotations)},
            "spec": {"unschedulable": True} if cordoned else {}}


def annotations(n: dict) -> dict:
    return n["metadata"].get("annotations") or {}


def test_the_two_roles_keep_their_annotation_names_others_get_their_own():
    assert cordon.keys(UPGRADE).was_cordoned == "gpuprov.io/upgrade-was-cordoned"
    assert cordon.keys(UPGRADE).failed == "gpuprov.io/upgrade-failed"
    assert cordon.keys(MIG).was_cordoned == "gpuprov.io/mig-was-cordoned"
    assert cordon.keys(MIG).failed == "gpuprov.io/mig-failed"
    assert cordon.keys(HEALTH).all == (
        "gpuprov.io/health-remediate-was-cordoned", "gpuprov.io/health-remediate-cordon-reason",
        "gpuprov.io/health-remediate-cordoned-at", "gpuprov.io/health-remediate-failed")


@pytest.mark.parametrize("owner", ["", "Gpu-Mig", "gpu_mig", "-x", "a" * 41, None, "a/b"])
def test_an_owner_must_make_an_annotation_name(owner):
    with pytest.raises(ValueError, match="owner"):
        cordon.keys(owner)


def test_take_cordons_and_records_why_when_and_that_it_was_not_cordoned():
    taken = apply(node(), cordon.take(node(), HEALTH, "XID 79:\n GPU fell off the bus", NOW))
    keys = cordon.keys(HEALTH)
    assert taken["spec"]["unschedulable"] is True
    assert annotations(taken) == {keys.was_cordoned: "false",
                                  keys.reason: "XID 79: GPU fell off the bus",
                                  keys.since: "2026-11-26T18:00:05Z"}
    back = apply(taken, cordon.give_back(taken, HEALTH))
    assert back["spec"]["unschedulable"] is False
    assert annotations(back) == {}


def test_an_admins_cordon_is_recorded_and_kept():
    admin = node(cordoned=True, note="rack 4 maintenance")
    taken = apply(admin, cordon.take(admin, UPGRADE, "driver", NOW))
    assert annotations(taken)[cordon.keys(UPGRADE).was_cordoned] == "true"
    back = apply(taken, cordon.give_back(taken, UPGRADE))
    assert back["spec"]["unschedulable"] is True
    assert annotations(back) == {"note": "rack 4 maintenance"}  # only gpuprov's record goes


def test_a_second_take_keeps_the_first_record_and_time():
    first = apply(node(), cordon.take(node(), MIG, "layout a", NOW))
    again = apply(first, cordon.take(first, MIG, "layout b", NOW + timedelta(hours=1)))
    keys = cordon.keys(MIG)
    assert annotations(again)[keys.was_cordoned] == "false"  # not "true": the cordon is ours
    assert annotations(again)[keys.since] == "2026-11-26T18:00:05Z"
    assert annotations(again)[keys.reason] == "layout b"


def test_failed_keeps_the_node_cordoned_and_the_record_so_the_fix_gives_back_only_what_was_taken():
    taken = apply(node(), cordon.take(node(), UPGRADE, "driver", NOW))
    uncordoned_by_hand = apply(taken, {"spec": {"unschedulable": False}})
    failed = apply(uncordoned_by_hand, cordon.failed(UPGRADE, "Install: apt\nfailed"))
    keys = cordon.keys(UPGRADE)
    assert failed["spec"]["unschedulable"] is True
    assert annotations(failed)[keys.failed] == "Install: apt failed"
    assert cordon.unfinished(failed, UPGRADE) == list(keys.all)
    back = apply(failed, cordon.give_back(failed, UPGRADE))
    assert back["spec"]["unschedulable"] is False and annotations(back) == {}


def test_nested_owners_uncordon_when_the_last_gives_the_node_back():
    up = apply(node(), cordon.take(node(), UPGRADE, "driver", NOW))
    both = apply(up, cordon.take(up, HEALTH, "XID 48", NOW))
    # Health took over the upgrade's record of the node before gpuprov: not cordoned.
    assert annotations(both)[cordon.keys(HEALTH).was_cordoned] == "false"
    assert cordon.holders(both) == ["health-remediate", "upgrade"]
    upgrade_done = apply(both, cordon.give_back(both, UPGRADE))
    assert upgrade_done["spec"]["unschedulable"] is True  # health still holds it
    health_done = apply(upgrade_done, cordon.give_back(upgrade_done, HEALTH))
    assert health_done["spec"]["unschedulable"] is False
    assert annotations(health_done) == {}


def test_nested_owners_keep_an_admins_cordon():
    admin = node(cordoned=True)
    mig = apply(admin, cordon.take(admin, MIG, "layout", NOW))
    both = apply(mig, cordon.take(mig, HEALTH, "XID 48", NOW))
    assert annotations(both)[cordon.keys(HEALTH).was_cordoned] == "true"
    for owner in (MIG, HEALTH):
        both = apply(both, cordon.give_back(both, owner))
    assert both["spec"]["unschedulable"] is True


def test_a_long_reason_is_one_cut_line():
    patch = cordon.take(node(), HEALTH, "x\n" * 500, NOW)
    reason = patch["metadata"]["annotations"][cordon.keys(HEALTH).reason]
    assert len(reason) == cordon.REASON_MAX and reason.endswith("...") and "\n" not in reason


def test_the_time_is_utc_and_must_carry_a_zone():
    later = datetime(2026, 11, 26, 19, 0, 5, tzinfo=timezone(timedelta(hours=1)))
    assert cordon.take(node(), MIG, "x", later)["metadata"]["annotations"][
        cordon.keys(MIG).since] == "2026-11-26T18:00:05Z"
    with pytest.raises(ValueError, match="time zone"):
        cordon.take(node(), MIG, "x", datetime(2026, 11, 26))


def test_a_node_object_from_the_kubernetes_client_reads_the_same():
    """read_node(...).to_dict() gives snake_case keys: the two this module reads are one word."""
    from kubernetes import client

    api_node = client.V1Node(metadata=client.V1ObjectMeta(
        name="gpu-a", annotations={cordon.keys(MIG).was_cordoned: "true"}),
        spec=client.V1NodeSpec(unschedulable=True))
    assert cordon.was_cordoned(api_node.to_dict(), MIG) is True
    assert cordon.give_back(api_node.to_dict(), MIG) == {
        "metadata": {"annotations": dict.fromkeys(cordon.keys(MIG).all)}}


# -- the host's GPU clients ---------------------------------------------------------------


def list_units(*units: str) -> str:
    """`systemctl list-units --type=service --state=active --plain --no-legend` lines."""
    return "".join(f"{u} loaded active running {u.split('.')[0]} daemon\n" for u in units)


def test_running_clients_stop_in_reverse_start_order_and_start_in_order():
    active = list_units("ssh.service", "nvidia-dcgm.service", "nvidia-persistenced.service",
                        "nvidia-fabricmanager.service")
    found = cordon.host_clients(active, started_elsewhere=["nvidia-persistenced.service"])
    assert found == {
        "running": ["nvidia-persistenced.service", "nvidia-fabricmanager.service",
                    "nvidia-dcgm.service"],
        "stop": ["nvidia-dcgm.service", "nvidia-fabricmanager.service",
                 "nvidia-persistenced.service"],
        "start": ["nvidia-fabricmanager.service", "nvidia-dcgm.service"]}


def test_no_running_client_means_nothing_to_stop_and_a_unit_not_asked_about_is_left():
    assert cordon.host_clients("") == {"running": [], "stop": [], "start": []}
    assert cordon.host_clients(list_units("ssh.service", "dcgm-exporter.service"))["stop"] == []
    assert cordon.host_clients(list_units("dcgm.service"), ["nvidia-dcgm.service"])["stop"] == []


def test_the_clients_need_systemctls_text():
    with pytest.raises(TypeError, match="systemctl"):
        cordon.host_clients(None)
