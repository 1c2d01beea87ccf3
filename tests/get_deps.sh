#!/usr/bin/env bash
# Makes the HTTP example's libraries available to the build: Boost.Beast and
# Boost.Asio (Debian's libboost1.81-dev, header-only: build/serve's HTTP server),
# cpp-httplib (Debian's libcpp-httplib-dev: the HTTP clients of build/loadgen
# and the serve tests) and nlohmann/json (Debian's nlohmann-json3-dev: parsing
# untrusted JSON). Only build/serve, build/loadgen and the serve tests use
# them; `make run`, the headers of the engine and every other example never do.
#
# Boost first: Boost 1.81 or newer in /usr/include or DEPS/include will do;
# else, as root on a machine without Boost, apt-get install libboost1.81-dev;
# otherwise (not root, or an older Boost that other software may need)
# apt-get download it and unpack its headers into DEPS/include, which the
# Makefile searches before /usr/include. Then cpp-httplib and nlohmann/json,
# in order:
#   1. both are installed (/usr/include/httplib.h, /usr/include/nlohmann/json.hpp): done;
#   2. DEPS holds both (an earlier run of this script): done;
#   3. we are root: apt-get install them (apt-get update first when the
#      package lists are missing or stale);
#   4. otherwise: apt-get download the Debian packages (no root needed) and
#      unpack headers into DEPS/include and libraries into DEPS/lib (the
#      Makefile adds both), with the headers and libraries cpp-httplib itself
#      needs when the system lacks them (OpenSSL, zlib, brotli).
# Debian builds cpp-httplib as a shared library (libcpp-httplib.so) with
# OpenSSL, zlib and brotli support compiled in, and its header changes the
# layout of its classes with those options: a program must be compiled with
# the same -D flags the library was. We read them from the package's own
# pkg-config file and write them to DEPS/http.flags (compile) and
# DEPS/http.libs (link), which the Makefile passes to the compiler.
# Nothing is ever copied into the repository; DEPS lives under build/.
#
# With --promtool it also unpacks promtool, Prometheus's checker, from Debian's
# prometheus package into DEPS/bin (no root, no daemon installed or started),
# unless a promtool is already on the PATH: tests/test_serve.cpp runs
# `promtool check metrics` on build/serve's /metrics when one is there.
# Usage: tests/get_deps.sh DEPS [--promtool]
set -u
deps=${1:-build/deps}
mkdir -p "$deps"
deps_abs=$(cd "$deps" && pwd)

if [ "${2:-}" = "--promtool" ]; then
    if command -v promtool >/dev/null || [ -x "$deps/bin/promtool" ]; then exit 0; fi
    echo "get_deps: fetching promtool from Debian's prometheus package into $deps/bin" >&2
    rm -rf "$deps/prom" && mkdir -p "$deps/prom" "$deps/bin"
    if (cd "$deps/prom" && apt-get download prometheus >/dev/null 2>&1) && dpkg-deb -x "$deps"/prom/prometheus_*.deb "$deps/prom/root" &&
        [ -x "$deps/prom/root/usr/bin/promtool" ]; then
        cp "$deps/prom/root/usr/bin/promtool" "$deps/bin/promtool"
        rm -rf "$deps/prom"
        exit 0
    fi
    rm -rf "$deps/prom"
    echo "get_deps: could not fetch promtool (apt-get download prometheus failed); the /metrics check will be skipped" >&2
    exit 1
fi

# The -D flags of cpp-httplib's pkg-config file $1, and the link line.
write_flags() {
    local pc=$1 libdir=$2
    local cflags
    cflags=$(sed -n 's/^Cflags:\(.*\)$/\1/p' "$pc" | tr ' ' '\n' | grep '^-D' | tr '\n' ' ')
    local libs="-lcpp-httplib -pthread"
    # RPATH (not RUNPATH): it also finds the libraries libcpp-httplib.so
    # needs itself when those were unpacked here too.
    [ -n "$libdir" ] && libs="-L$libdir -Wl,--disable-new-dtags,-rpath,$libdir $libs"
    # Written aside and renamed into place: a build running beside us (CI runs
    # several makes at once) reads the old file or the new one, never half.
    printf '%s\n' "$cflags" > "$deps/http.flags.$$" && mv -f "$deps/http.flags.$$" "$deps/http.flags"
    printf '%s\n' "$libs" > "$deps/http.libs.$$" && mv -f "$deps/http.libs.$$" "$deps/http.libs"
}

system_pc() { ls /usr/lib/*/pkgconfig/cpp-httplib.pc /usr/lib/pkgconfig/cpp-httplib.pc 2>/dev/null | head -1; }
have_system() { [ -f /usr/include/httplib.h ] && [ -f /usr/include/nlohmann/json.hpp ] && [ -n "$(system_pc)" ]; }
have_local() { [ -f "$deps/include/httplib.h" ] && [ -f "$deps/include/nlohmann/json.hpp" ] && [ -f "$deps/lib/libcpp-httplib.so" ] && [ -f "$deps/pkg/cpp-httplib.pc" ]; }

# ---- Boost ------------------------------------------------------------------
boost_ok() {  # $1: an include directory holding Boost 1.81 or newer, with Beast
    local v
    v=$(sed -n 's/^#define BOOST_VERSION \([0-9]*\)$/\1/p' "$1/boost/version.hpp" 2>/dev/null)
    [ -n "$v" ] && [ "$v" -ge 108100 ] && [ -f "$1/boost/beast/http.hpp" ] && [ -f "$1/boost/asio.hpp" ]
}
# (PAGEDKV_DEPS_UNPACK_ALL=1: unpack into DEPS even when /usr/include has it,
# to test that path on a machine that has Boost.)
system_boost_ok() { [ -z "${PAGEDKV_DEPS_UNPACK_ALL:-}" ] && boost_ok /usr/include; }
if ! boost_ok "$deps/include" && ! system_boost_ok; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ ! -e /usr/include/boost ]; then
        echo "get_deps: installing Debian's libboost1.81-dev (apt-get; headers only are used)" >&2
        apt-get install -y libboost1.81-dev >/dev/null 2>&1 ||
            { apt-get update >/dev/null 2>&1 && apt-get install -y libboost1.81-dev >/dev/null 2>&1; }
    fi
    if ! system_boost_ok && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
        echo "get_deps: fetching Debian's libboost1.81-dev package into $deps (its headers; no root needed)" >&2
        rm -rf "$deps/boost-pkg" && mkdir -p "$deps/boost-pkg" "$deps/include"
        if (cd "$deps/boost-pkg" && apt-get download libboost1.81-dev >/dev/null 2>&1) &&
            dpkg-deb -x "$deps"/boost-pkg/libboost1.81-dev_*.deb "$deps/boost-pkg/root"; then
            rm -rf "$deps/include/boost" && mv "$deps/boost-pkg/root/usr/include/boost" "$deps/include/boost"
        fi
        rm -rf "$deps/boost-pkg"
    fi
    if ! boost_ok "$deps/include" && ! system_boost_ok; then
        cat >&2 <<MSG
error: build/serve needs Boost 1.81 or newer (Beast and Asio; Debian package libboost1.81-dev),
which is not installed and could not be fetched. Only build/serve needs it.
    sudo apt-get update && sudo apt-get install -y libboost1.81-dev
MSG
        exit 1
    fi
fi

# ---- cpp-httplib and nlohmann/json -----------------------------------------
if have_system; then write_flags "$(system_pc)" ""; exit 0; fi
if have_local; then write_flags "$deps/pkg/cpp-httplib.pc" "$deps_abs/lib"; exit 0; fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "get_deps: installing Debian's libcpp-httplib-dev and nlohmann-json3-dev (apt-get)" >&2
    if (apt-get install -y libcpp-httplib-dev nlohmann-json3-dev >/dev/null 2>&1 ||
        { apt-get update >/dev/null 2>&1 && apt-get install -y libcpp-httplib-dev nlohmann-json3-dev >/dev/null 2>&1; }) && have_system; then
        write_flags "$(system_pc)" ""
        exit 0
    fi
fi

if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
    echo "get_deps: fetching Debian's libcpp-httplib-dev and nlohmann-json3-dev packages into $deps (no root needed)" >&2
    pkg="$deps/pkg"
    rm -rf "$pkg" && mkdir -p "$pkg/root"
    # The runtime package's name carries the library's version (libcpp-httplib0.11).
    runtime=$(apt-cache depends libcpp-httplib-dev 2>/dev/null | sed -n 's/.*Depends: \(libcpp-httplib[0-9.]*\)$/\1/p' | head -1)
    want="libcpp-httplib-dev nlohmann-json3-dev $runtime"
    # What libcpp-httplib's header includes and its library links, when missing here.
    # (PAGEDKV_DEPS_UNPACK_ALL=1 unpacks them anyway: how this path is tested
    # on a machine that has them.)
    all=${PAGEDKV_DEPS_UNPACK_ALL:-}
    if [ -n "$all" ] || [ ! -f /usr/include/openssl/ssl.h ]; then want="$want libssl-dev"; fi
    if [ -n "$all" ] || [ ! -f /usr/include/zlib.h ]; then want="$want zlib1g-dev"; fi
    if [ -n "$all" ] || [ ! -f /usr/include/brotli/decode.h ]; then want="$want libbrotli-dev"; fi
    if [ -n "$all" ] || ! ldconfig -p 2>/dev/null | grep -q 'libbrotlidec.so.1 '; then want="$want libbrotli1"; fi
    ok=1
    for p in $want; do
        (cd "$pkg" && apt-get download "$p" >/dev/null 2>&1) || { echo "get_deps: apt-get download $p failed" >&2; ok=0; }
    done
    if [ $ok = 1 ]; then
        for deb in "$pkg"/*.deb; do dpkg-deb -x "$deb" "$pkg/root" || ok=0; done
    fi
    if [ $ok = 1 ] && [ -f "$pkg/root/usr/include/httplib.h" ] && [ -f "$pkg/root/usr/include/nlohmann/json.hpp" ]; then
        mkdir -p "$deps/include" "$deps/lib"
        # Headers, and the multiarch headers (openssl/opensslconf.h) merged in.
        cp -r "$pkg/root/usr/include/." "$deps/include/"
        for d in "$pkg"/root/usr/include/*-linux-gnu; do [ -d "$d" ] && cp -r "$d/." "$deps/include/"; done
        find "$pkg/root/usr/lib" "$pkg/root/lib" \( -name '*.so' -o -name '*.so.*' \) -exec cp -P {} "$deps/lib/" \; 2>/dev/null
        cp "$(ls "$pkg"/root/usr/lib/*/pkgconfig/cpp-httplib.pc | head -1)" "$pkg/cpp-httplib.pc"
        if have_local; then write_flags "$pkg/cpp-httplib.pc" "$deps_abs/lib"; exit 0; fi
    fi
fi
cat >&2 <<MSG
error: the HTTP example's libraries (Debian packages libcpp-httplib-dev and nlohmann-json3-dev)
are not installed and could not be fetched. Only build/serve, build/loadgen and the serve tests need them.
    sudo apt-get update && sudo apt-get install -y libcpp-httplib-dev nlohmann-json3-dev
MSG
exit 1
