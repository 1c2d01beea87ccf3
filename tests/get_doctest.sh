#!/usr/bin/env bash
# Makes doctest's header available to the test build, so that `make test` on a
# fresh Debian/Ubuntu machine needs nothing typed first. In order:
#   1. /usr/include/doctest/doctest.h exists (Debian's doctest-dev): done;
#   2. DEPS/include/doctest/doctest.h exists (an earlier run of this script): done;
#   3. we are root: apt-get install doctest-dev (the project's one test dependency);
#   4. otherwise: apt-get download the Debian package (no root needed) and
#      unpack its header into DEPS/include, which the Makefile adds to the
#      include path.
# doctest is never copied into the repository; DEPS lives under build/.
# Usage: tests/get_doctest.sh DEPS
set -u
deps=${1:-build/deps}
[ -f /usr/include/doctest/doctest.h ] && exit 0
[ -f "$deps/include/doctest/doctest.h" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "get_doctest: installing Debian's doctest-dev (apt-get)" >&2
    if (apt-get install -y doctest-dev >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y doctest-dev >/dev/null 2>&1; }) \
        && [ -f /usr/include/doctest/doctest.h ]; then
        exit 0
    fi
fi
if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
    echo "get_doctest: fetching Debian's doctest-dev package into $deps (no root needed)" >&2
    mkdir -p "$deps/pkg" && rm -f "$deps"/pkg/doctest-dev_*.deb
    if (cd "$deps/pkg" && apt-get download doctest-dev >/dev/null 2>&1) && deb=$(ls "$deps"/pkg/doctest-dev_*.deb 2>/dev/null | head -1) \
        && [ -n "$deb" ] && dpkg-deb -x "$deb" "$deps/pkg/root" && [ -f "$deps/pkg/root/usr/include/doctest/doctest.h" ]; then
        mkdir -p "$deps/include" && cp -r "$deps/pkg/root/usr/include/doctest" "$deps/include/"
        exit 0
    fi
fi
cat >&2 <<MSG
error: doctest (the test framework, Debian package doctest-dev) is not installed and could not be fetched.
    sudo apt-get update && sudo apt-get install -y doctest-dev
or put doctest.h at $deps/include/doctest/doctest.h (or pass DOCTEST_INC=dir holding doctest/doctest.h).
MSG
exit 1
