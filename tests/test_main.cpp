// The main of a test executable that holds several QtTest classes (see test_main.h).

#include "tests/test_main.h"

#include <QCoreApplication>
#ifdef BATCHPILOT_TEST_WIDGETS
#include <QApplication>
#endif

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace batchpilot::tests {
namespace {

std::map<std::string, TestRunner>& registry() {
    static std::map<std::string, TestRunner> tests;
    return tests;
}

/// "…/tst_fault_injection.cpp" → "fault_injection".
std::string unitOf(const std::string& path) {
    std::string name = path.substr(path.find_last_of('/') + 1);
    if (name.rfind("tst_", 0) == 0) name.erase(0, 4);
    if (const auto dot = name.rfind('.'); dot != std::string::npos) name.erase(dot);
    return name;
}

}  // namespace

bool registerTest(const char* sourceFile, TestRunner run) {
    registry()[unitOf(sourceFile)] = run;
    return true;
}

}  // namespace batchpilot::tests

int main(int argc, char** argv) {
    const auto& tests = batchpilot::tests::registry();
    const auto found = argc >= 2 ? tests.find(argv[1]) : tests.end();
    if (found == tests.end()) {
        std::fprintf(stderr, "usage: %s UNIT [QtTest arguments]\n%s%s%sunits:", argv[0],
                     argc >= 2 ? "error: no test unit \"" : "", argc >= 2 ? argv[1] : "", argc >= 2 ? "\"\n" : "");
        for (const auto& [name, run] : tests) std::fprintf(stderr, " %s", name.c_str());
        std::fprintf(stderr, "\n");
        return 2;
    }
    // QtTest sees the program and the arguments after the unit, as a one-class executable would.
    std::vector<char*> rest{argv[0]};
    rest.insert(rest.end(), argv + 2, argv + argc);
    int restCount = static_cast<int>(rest.size());
    rest.push_back(nullptr);
#ifdef BATCHPILOT_TEST_WIDGETS
    // The window's tests (tests/ui): what QTEST_MAIN gives a test of widgets.
    QApplication app(restCount, rest.data());
    app.setAttribute(Qt::AA_Use96Dpi, true);
#else
    // Every class gets what QTEST_GUILESS_MAIN gives a test without a GUI: an application object.
    QCoreApplication app(restCount, rest.data());
#endif
    return found->second(restCount, rest.data());
}
