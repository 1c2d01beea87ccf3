// The doctest runner for every suite in tests/. Each test_*.cpp adds its cases.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
