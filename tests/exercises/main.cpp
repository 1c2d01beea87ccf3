// tests/exercises/main.cpp -- the doctest runner for the course kit's checks.
//
// `make grade` (tools/kit.cpp) compiles each tests/exercises/exNN.cpp with this
// file into one small program per exercise and runs every TEST_CASE of it in
// a process of its own (`-tc=NAME`), so that a stub that throws, aborts or
// hangs costs that one check and nothing else. A check file follows a few
// rules, because the kit reads it as well as compiles it:
//   - one TEST_CASE is one check, named in plain words (no `*`, `?`, `,`,
//     `[` or `]`: doctest's -tc filter would read them as patterns);
//   - it expects what it checks from its own arithmetic, not from another
//     exercise's code where that is practical, so that a student can grade
//     exercise 9 before writing exercise 8 (the kit grades each exercise in
//     a tree where every other region is the reference's anyway);
//   - it needs no model files and runs in well under a second;
//   - `// kit: tsan` anywhere in the file makes the kit build it once more
//     under ThreadSanitizer and count "no data race" as one more check.
// These files are not part of `make test`: they are the course's checks, and
// the reference passes them all (CI: `make kit-selftest`).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
