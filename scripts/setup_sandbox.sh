#!/bin/sh
# Grading runs each submission in a bubblewrap sandbox (autograder/secure_grading.py). Install
# Debian's bubblewrap when it is missing and we may (root with apt-get); otherwise say how.
set -e
command -v bwrap >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing bubblewrap (the grading sandbox) with apt-get"
    apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null; }
    command -v bwrap >/dev/null 2>&1 && exit 0
fi
echo "Grading needs bubblewrap (bwrap) to isolate each submission." >&2
echo "Install it as an administrator: apt-get install bubblewrap (Debian/Ubuntu), dnf install bubblewrap (Fedora)." >&2
exit 1
