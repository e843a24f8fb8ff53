#!/bin/sh
# Start a learner's Jupyter server as the learner. The hub (root) runs this with the learner's
# environment and the server's command line as arguments (workshop/hub.py, WorkshopSpawner):
#   USER                     the learner's account
#   GPULAB_WORKSHOP_COURSE   the course release, copied to a new learner's ~/course
#   GPULAB_WORKSHOP_HIDE     a folder learners may not enter that holds what they must run
#                            (root's home, when the Python lives there, e.g. pyenv): in a
#                            private mount namespace it is covered by an empty folder...
#   GPULAB_WORKSHOP_REVEAL   ...into which these paths (colon-separated) are bound back read-only.
# Every step uses `exec`, so the hub's process id is the server's own and its signals reach it.
set -eu
user="${USER:?the hub sets USER}"
if [ -n "${GPULAB_WORKSHOP_HIDE:-}" ] && [ "${GPULAB_WORKSHOP_IN_NAMESPACE:-}" != 1 ]; then
    GPULAB_WORKSHOP_IN_NAMESPACE=1 exec unshare --mount --propagation private -- "$0" "$@"
fi
if [ -n "${GPULAB_WORKSHOP_HIDE:-}" ]; then
    hidden="$GPULAB_WORKSHOP_HIDE"
    stage=$(mktemp -d)
    mount --bind "$hidden" "$stage"
    mount -t tmpfs -o mode=0755,size=1m gpulab-hidden "$hidden"
    old_ifs=$IFS; IFS=:
    for path in $GPULAB_WORKSHOP_REVEAL; do
        mkdir -p "$path"
        mount --bind "$stage${path#"$hidden"}" "$path"
        mount -o remount,bind,ro "$path"
    done
    IFS=$old_ifs
    umount -l "$stage"
    rmdir "$stage"
fi
course="${GPULAB_WORKSHOP_COURSE:?the hub sets GPULAB_WORKSHOP_COURSE}"
unset GPULAB_WORKSHOP_HIDE GPULAB_WORKSHOP_REVEAL GPULAB_WORKSHOP_IN_NAMESPACE GPULAB_WORKSHOP_COURSE
cd "$HOME"
# The learner's own identity from here on; no setuid program can raise it again.
as_learner="setpriv --reuid=$user --regid=$(id -g "$user") --init-groups --no-new-privs --"
# First start: the learner's own copy of the course. Later starts keep their work as it is.
[ -e "$HOME/course" ] || $as_learner cp -R "$course" "$HOME/course"
exec $as_learner "$@"
