# What the nvidia_driver role needs to know about a node, in one read (run with `sh -c`):
# the package database and whether dpkg was interrupted, the loaded kernel modules, and
# nvidia-persistenced's unit. Parsed on the controller by the gpuprov_node_read filter
# (plugins/filter/gpuprov_node_state.py). One line per fact, tab-separated, first field a tag:
#   pkg          <name> <version> <selection flag state>   (dpkg-query, as the probe reads it)
#   interrupted  <what>                                      (dpkg must finish first)
#   module       nouveau | nvidia <first line of /proc/driver/nvidia/version>
#   unit         nvidia-persistenced <is-enabled> <is-active>
#   file         <path> <mode> <uid> <gid> <sha1>  <path>      (each file named, if it exists)
# It only reads. One command instead of one Ansible task per fact: each task costs a Python
# start on the node, and a converged node needs nothing but these reads.
# Arguments: a directory that stands for / (tests only: tests/unit/test_node_reads.py; the
# role passes ""), then the files the role writes, so that it writes only those that differ
# (the same `find` the nvidia_container_toolkit role runs for its files).
root=${1:-}
[ $# -gt 0 ] && shift
tab=$(printf '\t')
if command -v dpkg-query >/dev/null 2>&1; then
    # `dpkg --audit` lists half-installed and unconfigured packages; a journal entry under
    # /var/lib/dpkg/updates is what apt checks before it says "dpkg was interrupted".
    if [ -n "$(dpkg --audit 2>&1)" ]; then
        echo "interrupted${tab}dpkg --audit lists packages"
    fi
    for entry in "$root"/var/lib/dpkg/updates/*; do
        case ${entry##*/} in
            '' | *[!0-9]*) ;;
            *) echo "interrupted${tab}dpkg journal entries in /var/lib/dpkg/updates"; break ;;
        esac
    done
    dpkg-query --show --showformat="pkg${tab}\${Package}${tab}\${Version}${tab}\${Status}\n"
fi
if [ -d "$root/sys/module/nouveau" ]; then
    echo "module${tab}nouveau"
fi
if [ -r "$root/proc/driver/nvidia/version" ]; then
    echo "module${tab}nvidia${tab}$(head -n 1 "$root/proc/driver/nvidia/version")"
fi
if command -v systemctl >/dev/null 2>&1; then
    echo "unit${tab}nvidia-persistenced${tab}$(systemctl is-enabled nvidia-persistenced 2>/dev/null)${tab}$(systemctl is-active nvidia-persistenced 2>/dev/null)"
fi
if [ $# -gt 0 ]; then
    find "$@" -maxdepth 0 -type f -printf "file${tab}%p${tab}%#m${tab}%U${tab}%G${tab}" \
        -exec sha1sum {} \; 2>/dev/null
fi
exit 0
