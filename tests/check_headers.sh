#!/usr/bin/env bash
# Each header is a chapter that must stand on its own:
#   1. every header compiles alone (it includes what it uses);
#   2. block_pool.hpp, free_block_queue.hpp, prefix_index.hpp, prefix_cache.hpp
#      and scheduler.hpp pull in nothing of the CUDA shim (no cuda_shim.hpp, no <thread>, no
#      <barrier>): the engine's bookkeeping is plain C++;
#   3. the two tiers: the reference never includes lab/ or examples/, and a
#      reference header is at most 550 lines;
#   4. no header defines a reserved name (a macro starting with "__" or with
#      "_" and a capital letter): those belong to the compiler.
# Usage: tests/check_headers.sh CXX [flags...]   (run from the repository root)
set -u
cxx=${1:-g++}; shift || true
flags=("$@")
fail=0
headers=$(ls *.hpp *.cuh core/*.hpp core/emu/*.hpp tiny_model/*.hpp tiny_model/*.cuh examples/*.hpp lab/*.hpp lab/*.cuh 2>/dev/null)
tmp=$(mktemp -d)
jobs=$(nproc 2>/dev/null || echo 2)
i=0
for h in $headers; do
    ( printf '#include "%s"\n' "$h" | "$cxx" -std=c++20 -Wall -Wextra -Werror -I. "${flags[@]}" -x c++ -fsyntax-only - \
        > "$tmp/$i.log" 2>&1 || echo "$h" > "$tmp/$i.fail" ) &
    i=$((i + 1))
    [ $((i % jobs)) -eq 0 ] && wait
done
wait
for f in "$tmp"/*.fail; do
    [ -e "$f" ] || continue
    echo "check_headers: $(cat "$f") does not compile on its own:"; head -5 "${f%.fail}.log"; fail=1
done
rm -rf "$tmp"
for h in core/block_pool.hpp core/free_block_queue.hpp core/prefix_index.hpp core/prefix_cache.hpp scheduler.hpp; do
    inc=$(printf '#include "%s"\n' "$h" | "$cxx" -std=c++20 -I. -x c++ -E -H - 2>&1 >/dev/null | grep -E 'cuda_shim\.hpp|/thread$|/barrier$|paged_kv\.cuh' || true)
    if [ -n "$inc" ]; then echo "check_headers: $h pulls in the CUDA shim or its threads:"; echo "$inc"; fail=1; fi
done
# The two tiers (README.md, "Layout"): the reference -- the top level, core/
# and tiny_model/ -- never includes lab/ or examples/; outside lab/, only
# examples/devices.hpp (the one seam where programs choose lab's fast paths
# and policies) includes lab/ headers. Tests and tools may include anything.
reference=$(ls *.hpp *.cuh core/*.hpp core/emu/*.hpp tiny_model/*.hpp tiny_model/*.cuh 2>/dev/null)
up=$(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"(lab|examples)/' $reference || true)
if [ -n "$up" ]; then echo "check_headers: the reference includes lab/ or examples/:"; echo "$up"; fail=1; fi
lab_users=$(grep -lE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"lab/' examples/*.hpp examples/*.cpp 2>/dev/null | grep -v '^examples/devices.hpp$' || true)
if [ -n "$lab_users" ]; then echo "check_headers: only examples/devices.hpp may include lab/ outside lab/, not:"; echo "$lab_users"; fail=1; fi
# A reference header is a chapter read in one sitting: at most 550 lines.
for h in $reference; do
    n=$(wc -l < "$h")
    if [ "$n" -gt 550 ]; then echo "check_headers: $h has $n lines; a reference header fits one sitting (<= 550)"; fail=1; fi
done
# The key question in one sitting (README.md): who owns which block, the
# free list, the scheduler and the engine, about 1,100 lines together.
path_lines=$(cat core/block_pool.hpp core/free_block_queue.hpp scheduler.hpp engine.hpp | wc -l)
echo "check_headers: the key question's reading path (core/block_pool.hpp + core/free_block_queue.hpp + scheduler.hpp +" \
     "engine.hpp) is $path_lines lines; prefix caching's index and hashing (core/prefix_index.hpp, core/prefix_cache.hpp)" \
     "add $(cat core/prefix_index.hpp core/prefix_cache.hpp | wc -l), of which the reading path needs find_cached_prefix alone"
# What runs is what is read: outside its seams' comments, the reference
# names no lab idea (swap, the simulator). A seam's comment may say what
# plugs in there, once.
lab_names=$(grep -nE 'swap_(out|in|space)|apply_swaps|SimRunner|kSim|take_modelled|produces_tokens|needs_block_tables' $reference || true)
if [ -n "$lab_names" ]; then echo "check_headers: the reference names lab's swap or simulator in code:"; echo "$lab_names"; fail=1; fi
bad=$(grep -nE '^[[:space:]]*#[[:space:]]*define[[:space:]]+(__|_[A-Z])' $headers || true)
if [ -n "$bad" ]; then echo "check_headers: reserved names defined:"; echo "$bad"; fail=1; fi
[ $fail -eq 0 ] && echo "check_headers: $(echo $headers | wc -w) headers compile alone; block_pool.hpp, free_block_queue.hpp, prefix_index.hpp, prefix_cache.hpp and scheduler.hpp are plain C++; the reference never includes lab/ or examples/; no reserved names defined"
exit $fail
