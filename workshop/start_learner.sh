#!/bin/sh
# Start a learner's Jupyter server as the learner, inside their walls. The hub (root) runs this
# with the learner's environment and the server's command line as arguments (workshop/hub.py,
# WorkshopSpawner; under systemd inside the learner's scope, workshop/walls.py):
#   USER                           the learner's account
#   GPULAB_WORKSHOP_CGROUPS        the learner's cgroup folders (colon-separated; cgroupfs walls):
#                                  this process joins them first, so all it starts stays there
#   GPULAB_WORKSHOP_OOM_SCORE_ADJ  the learner's processes go first when the machine runs out of
#                                  memory; written as root, the learner cannot lower it
#   GPULAB_WORKSHOP_SCRATCH_BYTES  the size of the learner's own /tmp, /var/tmp and /dev/shm
#   GPULAB_WORKSHOP_KEEP           what learners must reach even where it lies in one of those
#                                  (colon-separated: the Python, the venv, the course checkout)
#   GPULAB_WORKSHOP_MASK           device nodes covered in the learner's namespace (cgroup v2)
#   GPULAB_WORKSHOP_HIDE           folders learners may not enter that hold what they must run
#                                  (colon-separated: root's home, when the Python lives there,
#                                  e.g. pyenv; a clone in a private folder): in the private mount
#                                  namespace each is covered by an empty folder...
#   GPULAB_WORKSHOP_REVEAL         ...into which these paths (colon-separated) are bound back, read-only
#   GPULAB_WORKSHOP_COURSE         the course release, copied to a new learner's ~/course
#   GPULAB_WORKSHOP_START_HERE     the page a learner's JupyterLab opens on, put in ~/course
# Every step uses `exec`, so the hub's process id is the server's own and its signals reach it.
set -eu
user="${USER:?the hub sets USER}"
if [ "${GPULAB_WORKSHOP_IN_NAMESPACE:-}" != 1 ]; then
    old_ifs=$IFS; IFS=:
    for cgroup in ${GPULAB_WORKSHOP_CGROUPS:-}; do
        echo $$ > "$cgroup/cgroup.procs"
    done
    IFS=$old_ifs
    echo "${GPULAB_WORKSHOP_OOM_SCORE_ADJ:-500}" > /proc/self/oom_score_adj
    # slave: mounts made inside stay inside; the host's unmounting a learner's home when they are
    # removed reaches every namespace (systemd's PrivateTmp= does the same). Where the host's
    # mounts are private (no systemd, as on the test machine) it is the same as private.
    GPULAB_WORKSHOP_IN_NAMESPACE=1 exec unshare --mount --propagation slave -- "$0" "$@"
fi
# In the learner's own mount namespace from here on.
old_ifs=$IFS; IFS=:
for hidden in ${GPULAB_WORKSHOP_HIDE:-}; do
    stage=$(mktemp -d)
    mount --bind "$hidden" "$stage"
    mount -t tmpfs -o mode=0755,size=1m gpulab-hidden "$hidden"
    for path in $GPULAB_WORKSHOP_REVEAL; do
        case "$path" in
            "$hidden"/*)
                mkdir -p "$path"
                mount --bind "$stage${path#"$hidden"}" "$path"
                mount -o remount,bind,ro "$path" ;;
        esac
    done
    umount -l "$stage"
    rmdir "$stage"
done
IFS=$old_ifs
# Other GPUs' device nodes, where no cgroup rule can close them (cgroup v2 without systemd):
# covered by an empty file of mode 0000, which no learner may open (EACCES).
if [ -n "${GPULAB_WORKSHOP_MASK:-}" ]; then
    blank=$(mktemp)
    chmod 000 "$blank"
    old_ifs=$IFS; IFS=:
    for node in $GPULAB_WORKSHOP_MASK; do
        mount --bind "$blank" "$node"
    done
    IFS=$old_ifs
    rm "$blank"
fi
# Scratch of their own: nobody else's files, and no file of theirs in anyone else's. Its pages
# count in the learner's memory (cgroup or scope), so together they can take no more than that.
# What the learner must still reach inside one of them (the course checkout, its venv or Python,
# e.g. a clone under /tmp) is bound back, read-only: the shell's working folder keeps the old
# folder reachable after the new one covers it.
size="${GPULAB_WORKSHOP_SCRATCH_BYTES:?the hub sets GPULAB_WORKSHOP_SCRATCH_BYTES}"
for dir in /tmp /var/tmp /dev/shm; do
    [ -d "$dir" ] || continue
    cd "$dir"
    mount -t tmpfs -o "size=$size,mode=1777,nosuid,nodev" gpulab-scratch "$dir"
    old_ifs=$IFS; IFS=:
    for path in ${GPULAB_WORKSHOP_KEEP:-}; do
        case "$path" in
            "$dir"/*)
                inside="${path#"$dir"/}"
                mkdir -p "$dir/$inside"
                mount --no-canonicalize --bind "./$inside" "$dir/$inside"  # ./: the old folder
                mount -o remount,bind,ro "$dir/$inside" ;;
        esac
    done
    IFS=$old_ifs
    cd /
done
course="${GPULAB_WORKSHOP_COURSE:?the hub sets GPULAB_WORKSHOP_COURSE}"
start_here="${GPULAB_WORKSHOP_START_HERE:-}"
unset GPULAB_WORKSHOP_HIDE GPULAB_WORKSHOP_REVEAL GPULAB_WORKSHOP_IN_NAMESPACE GPULAB_WORKSHOP_COURSE \
    GPULAB_WORKSHOP_CGROUPS GPULAB_WORKSHOP_MASK GPULAB_WORKSHOP_OOM_SCORE_ADJ \
    GPULAB_WORKSHOP_SCRATCH_BYTES GPULAB_WORKSHOP_START_HERE GPULAB_WORKSHOP_KEEP
cd "$HOME"
# The learner's own identity from here on; no setuid program can raise it again.
as_learner="setpriv --reuid=$user --regid=$(id -g "$user") --init-groups --no-new-privs --"
# First start: the learner's own copy of the course. Later starts keep their work as it is.
[ -e "$HOME/course" ] || $as_learner cp -R "$course" "$HOME/course"
[ -z "$start_here" ] || [ -e "$HOME/course/START_HERE.md" ] || $as_learner cp "$start_here" "$HOME/course/"
exec $as_learner "$@"
