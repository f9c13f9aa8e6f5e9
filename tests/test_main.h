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
