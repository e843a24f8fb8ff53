#!/bin/sh
# usage: scripts/need_system_package.sh COMMAND DEBIAN_PACKAGE "WHAT NEEDS IT"
# A system tool the course drives (bubblewrap for the grading sandbox, Chromium for the browser
# tests): install the Debian package when the command is missing and we may (root with apt-get);
# otherwise stop and say what to install.
set -e
command="$1"; package="$2"; needed_by="$3"
command -v "$command" >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $package ($needed_by) with apt-get"
    apt-get install -y -q "$package" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$package" >/dev/null 2>&1; } || true
    command -v "$command" >/dev/null 2>&1 && exit 0
fi
echo "$needed_by needs $command, from the $package package." >&2
echo "Install it as an administrator: apt-get install $package (Debian/Ubuntu), dnf install $package (Fedora)." >&2
exit 1
