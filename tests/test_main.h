#pragma once

// Many QtTest classes in one test executable. Each test file ends with
// BATCHPILOT_TEST_MAIN(Class) where a single-class file would say QTEST_MAIN(Class); the executable
// runs the class its first argument names (the file's name less "tst_" and ".cpp"), and passes the
// other arguments to QtTest:
//
//     tst_core_engine fault_injection -functions
//
// Why: every translation unit that includes torch costs ~14 s before its first line of test code
// (the precompiled header, QtTest's headers, the code they instantiate). Compiled together in unity
// batches (tests/core/CMakeLists.txt) the torch tests build in a fraction of the time they took as
// one executable each. Each file keeps its names in its own namespace (tst_<unit>), so that files
// sharing a batch do not collide.

#include <QtTest>

#include <concepts>
#include <type_traits>

#include "core/config/options.h"
#include "core/events/events.h"

namespace batchpilot::tests {

/// Runs one QtTest class: builds it and hands it to QTest::qExec.
using TestRunner = int (*)(int argc, char** argv);

/// Makes `run` the class run for the unit of `sourceFile` (a path ending in tst_<unit>.cpp).
bool registerTest(const char* sourceFile, TestRunner run);

}  // namespace batchpilot::tests

#define BATCHPILOT_TEST_CONCAT_(a, b) a##b
#define BATCHPILOT_TEST_CONCAT(a, b) BATCHPILOT_TEST_CONCAT_(a, b)
#define BATCHPILOT_TEST_MAIN(Class)                                                   \
    static const bool BATCHPILOT_TEST_CONCAT(batchpilotTestRegistered, __COUNTER__) = \
        ::batchpilot::tests::registerTest(__FILE__, [](int argc, char** argv) {       \
            Class test;                                                               \
            return QTest::qExec(&test, argc, argv);                                   \
        });

// QCOMPARE of two values of one of core's enums (RunState, Phase, MemorySavers, ...): on a
// mismatch QtTest prints each value with an unqualified toString(), which finds core's
// `const char* toString(RunState)` by argument-dependent lookup and then frees the string literal
// it returns with delete[]: the test aborted ("free(): invalid pointer") instead of naming the
// two values. This overload, more specialised than QtTest's, prints them with core's names.
namespace QTest {
template <typename E>
requires std::is_enum_v<E> && requires(E e) {
    { batchpilot::core::toString(e) } -> std::convertible_to<const char*>;
}
inline bool qCompare(const E& t1, const E& t2, const char* actual, const char* expected, const char* file, int line) {
    return compare_helper(
        t1 == t2, "Compared values are not the same", [&t1] { return qstrdup(batchpilot::core::toString(t1)); },
        [&t2] { return qstrdup(batchpilot::core::toString(t2)); }, actual, expected, file, line);
}
}  // namespace QTest
