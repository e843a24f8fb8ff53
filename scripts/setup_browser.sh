#!/bin/sh
# The browser tests (tests/test_browser.py) and `make screenshots` drive Debian's Chromium with
# Playwright (a Python package in the test extra; no browser download). Install Chromium when it
# is missing and we may (root with apt-get); otherwise say how.
set -e
command -v chromium >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (for the browser tests) with apt-get"
    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null; }
    command -v chromium >/dev/null 2>&1 && exit 0
fi
echo "The browser tests need Chromium at /usr/bin/chromium." >&2
echo "Install it as an administrator: apt-get install chromium (Debian/Ubuntu: the chromium package)." >&2
exit 1
