# What the nvidia_container_toolkit role needs to know about a node, in one read (run with
# `sh -c`; it only reads): the container runtime's version (does it run at all), containerd's
# main config, and the files the role writes. Parsed on the controller by the
# gpuprov_node_read filter (plugins/filter/gpuprov_node_state.py). One line per fact,
# tab-separated, first field a tag:
#   version  <exit status> <first line the version command printed>
#   content  <path> <base64 of the file>          (each config, if it is a file)
#   error    <path>                               (a config is there but could not be read)
#   file     <path> <mode> <uid> <gid> <sha1>  <path>   (each file named, if it exists; the
#            same find as the nvidia_driver role's read)
# One command instead of one Ansible task per fact: each task costs a Python start on the
# node, and a converged node needs nothing but this read and the key's download.
# Arguments: the version command (words), the configs to read (space-separated paths: the
# runtime's and the toolkit's own; "" for none), the files.
tab=$(printf '\t')
version_command=$1
configs=$2
shift 2
# Word splitting of the command is wanted: it is the role's own fixed argv, e.g.
# "containerd --version".
# shellcheck disable=SC2086
output=$($version_command 2>&1)
echo "version${tab}$?${tab}$(printf '%s\n' "$output" | head -n 1)"
# shellcheck disable=SC2086
for config in $configs; do
    [ -f "$config" ] || continue
    if text=$(base64 -w 0 < "$config"); then
        echo "content${tab}$config${tab}$text"
    else
        echo "error${tab}$config"
    fi
done
if [ $# -gt 0 ]; then
    find "$@" -maxdepth 0 -type f -printf "file${tab}%p${tab}%#m${tab}%U${tab}%G${tab}" \
        -exec sha1sum {} \; 2>/dev/null
fi
exit 0
