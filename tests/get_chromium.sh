#!/usr/bin/env bash
# Makes a headless browser available to the viewer's test (tests/test_viewer.cpp):
# Debian's `chromium`, which opens the page `make view` writes, dumps its DOM
# and takes screenshots. Only that test uses it; nothing is built with it.
#   1. `chromium` is on the PATH (or /usr/bin/chromium exists): done;
#   2. we are root: apt-get install chromium (apt-get update first when the
#      package lists are missing or stale), with the DejaVu fonts, so that text
#      in a screenshot is drawn with a real font on a machine that has none;
#   3. otherwise: say what to type, and exit 1. (A browser needs some fifty
#      libraries of its own: unpacking them by hand, as get_deps.sh does for
#      header-only packages, would be a second package manager.)
# Without a browser the viewer's browser test reports a skip that says so
# (a failure when PAGEDKV_REQUIRE_BROWSER=1, as in CI).
# Usage: tests/get_chromium.sh
set -u
have() { command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; }
have && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "get_chromium: installing Debian's chromium (apt-get; about 300 MB with its libraries)" >&2
    want="chromium fonts-dejavu-core"
    # (-o Dpkg::Use-Pty=0: no progress bars in a CI log)
    if apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0 $want >/dev/null 2>&1 ||
        { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0 $want >/dev/null 2>&1; }; then
        have && exit 0
    fi
fi
cat >&2 <<MSG
get_chromium: Debian's chromium (a headless browser for the viewer's test) is not installed and could not be.
    sudo apt-get update && sudo apt-get install -y chromium
MSG
exit 1
