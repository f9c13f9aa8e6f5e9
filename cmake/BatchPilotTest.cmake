# Every test's environment: the offscreen platform, its own runs folder, and one LibTorch thread.
# ctest -j N runs N tests at once, each counted as one CPU; a run takes every CPU by default, and
# N tests each running OpenMP on every CPU wait on each other's descheduled threads (measured on 2
# CPUs: the pip build's memory-parity test 47 s alone, 324 s beside the others). A run honours
# OMP_NUM_THREADS (core::intraOpThreadsFor), so does a CLI a test starts, and so does PyTorch.
# QtTest's per-function watchdog is set from each test's own timeout (batchpilot_set_watchdogs, below).
set(BATCHPILOT_TEST_ENVIRONMENT
    "QT_QPA_PLATFORM=offscreen;BATCHPILOT_RUNS_DIR=${CMAKE_BINARY_DIR}/test-runs;OMP_NUM_THREADS=1")

# The tests' own code at -O1 in the optimised builds (what they test, core/ and ui/, keeps -O2):
# their time goes to LibTorch and the engine, not to themselves, and a torch test file compiles in
# a fifth less time (a batch of tst_core_engine: 22.6 s against 28.0 s). The precompiled torch
# header, built at -O2, is still used (GCC needs __OPTIMIZE__ defined in both, not the same level).
function(batchpilot_test_optimization target)
  target_compile_options(${target} PRIVATE $<$<CONFIG:RelWithDebInfo,Release>:-O1>)
endfunction()

# batchpilot_add_test(<unit> SOURCE <file> LIBS <targets...> GROUP <group> [TIMEOUT s] [COST s] [TORCH]
#                     [NO_TEST])
# Builds one QtTest executable per unit and registers it with CTest as "<group>.<unit>".
function(batchpilot_add_test name)
  cmake_parse_arguments(ARG "TORCH;NO_TEST" "SOURCE;TIMEOUT;GROUP;COST" "LIBS" ${ARGN})
  set(target tst_${ARG_GROUP}_${name})
  add_executable(${target} ${ARG_SOURCE})
  target_link_libraries(${target} PRIVATE batchpilot_settings Qt6::Test ${ARG_LIBS})
  batchpilot_test_optimization(${target})
  if(ARG_TORCH)
    target_precompile_headers(${target} REUSE_FROM batchpilot_torch_pch)
    batchpilot_skip_pch_for_moc(${target})
  endif()
  set_target_properties(${target} PROPERTIES AUTOMOC ON)
  if(ARG_NO_TEST)  # the caller adds its own CTest entries (tests/core/CMakeLists.txt, user_models)
    return()
  endif()
  add_test(NAME ${ARG_GROUP}.${name} COMMAND ${target})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # COST: seconds a plain build took here; ctest -j starts the costliest first (until its own
  # measurements in Testing/ replace them), so that the long tests do not start last.
  if(NOT ARG_COST)
    set(ARG_COST 1)
  endif()
  set_tests_properties(${ARG_GROUP}.${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} COST ${ARG_COST}
                       ENVIRONMENT "${BATCHPILOT_TEST_ENVIRONMENT}")
endfunction()

# batchpilot_add_test_suite(<target> UNITS <[room/]unit...> LIBS <targets...> [TORCH] [WIDGETS] [BATCH n])
# One QtTest executable for several test files, built from tests/test_main.cpp and [room/]tst_<unit>.cpp
# of each unit in unity batches of BATCH files (6 unless given; see tests/test_main.h), with TORCH
# sharing the precompiled torch header, and WIDGETS giving each class a QApplication (QTEST_MAIN's,
# where the others get QTEST_GUILESS_MAIN's QCoreApplication); batchpilot_add_suite_test registers
# its units with CTest.
function(batchpilot_add_test_suite target)
  cmake_parse_arguments(ARG "TORCH;WIDGETS" "BATCH" "UNITS;LIBS" ${ARGN})
  if(NOT ARG_BATCH)
    set(ARG_BATCH 6)
  endif()
  set(sources "${PROJECT_SOURCE_DIR}/tests/test_main.cpp")
  # Each file's tst_<unit>.moc, from moc run on the file alone. AUTOMOC passes moc every include
  # path and lets it read torch's headers: ~2.5 s a file (56 s for the suite, once per build),
  # where the test classes need none of them (the output is the same).
  set(moc_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}_moc")
  foreach(path IN LISTS ARG_UNITS)
    get_filename_component(room "${path}" DIRECTORY)
    get_filename_component(unit "${path}" NAME)
    if(room)
      set(room "${room}/")
    endif()
    set(source "${CMAKE_CURRENT_SOURCE_DIR}/${room}tst_${unit}.cpp")
    list(APPEND sources "${source}")
    add_custom_command(OUTPUT "${moc_dir}/tst_${unit}.moc"
                       COMMAND Qt6::moc "${source}" -o "${moc_dir}/tst_${unit}.moc"
                       DEPENDS "${source}" Qt6::moc COMMENT "moc tst_${unit}.cpp" VERBATIM)
    list(APPEND sources "${moc_dir}/tst_${unit}.moc")
  endforeach()
  add_executable(${target} ${sources})
  batchpilot_test_optimization(${target})
  target_include_directories(${target} PRIVATE "${moc_dir}")
  target_link_libraries(${target} PRIVATE batchpilot_settings Qt6::Test ${ARG_LIBS})
  if(ARG_TORCH)
    target_precompile_headers(${target} REUSE_FROM batchpilot_torch_pch)
  endif()
  if(ARG_WIDGETS)
    target_compile_definitions(${target} PRIVATE BATCHPILOT_TEST_WIDGETS)
  endif()
  # Six files a batch for the torch tests: a batch compiles in about a minute, and the 2-core
  # machines CI runs on still have batches to build side by side.
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${ARG_BATCH})
  # The registry's main includes no torch.
  set_source_files_properties("${PROJECT_SOURCE_DIR}/tests/test_main.cpp" TARGET_DIRECTORY ${target}
                              PROPERTIES SKIP_PRECOMPILE_HEADERS ON SKIP_UNITY_BUILD_INCLUSION ON)
endfunction()

# batchpilot_add_suite_test(<unit> SUITE <target> GROUP <group> [TIMEOUT s] [COST s])
# Registers "<group>.<unit>" with CTest: the suite executable running tst_<unit>.cpp's class.
function(batchpilot_add_suite_test unit)
  cmake_parse_arguments(ARG "" "SUITE;GROUP;TIMEOUT;COST" "" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_COST)
    set(ARG_COST 1)
  endif()
  add_test(NAME ${ARG_GROUP}.${unit} COMMAND ${ARG_SUITE} ${unit})
  set_tests_properties(${ARG_GROUP}.${unit} PROPERTIES TIMEOUT ${ARG_TIMEOUT} COST ${ARG_COST}
                       ENVIRONMENT "${BATCHPILOT_TEST_ENVIRONMENT}")
endfunction()

# AUTOMOC's mocs_compilation.cpp of a target that reuses the precompiled torch header: the
# moc output is included by the sources themselves, so the file is empty, but with the header
# (~650 MB) it took ~8 s to compile, once per target.
function(batchpilot_skip_pch_for_moc target)
  set_source_files_properties("${CMAKE_CURRENT_BINARY_DIR}/${target}_autogen/mocs_compilation.cpp"
                              TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
endfunction()

# batchpilot_set_watchdogs(): called last in each tests/ folder (CMake sets a test's properties
# only in the folder that made it). Each test's CTest timeout is three times as long in a sanitizer
# build (scripts/check: two to three times slower, on CI's shared machines slower still), and
# QtTest's per-function watchdog (5 minutes by default) is set 30 s under it: a slow function on
# a loaded 2-core machine (the slowest take 80–90 s on a quiet one) is not killed early, and a
# hang is still reported with the function's name before CTest ends the test.
function(batchpilot_set_watchdogs)
  get_property(folder_tests DIRECTORY PROPERTY TESTS)
  foreach(test IN LISTS folder_tests)
    get_test_property(${test} TIMEOUT seconds)
    if(NOT seconds)
      set(seconds 900)  # scripts/test runs ctest --timeout 900
    endif()
    if(BATCHPILOT_SANITIZE)
      math(EXPR seconds "${seconds} * 3")
      set_tests_properties(${test} PROPERTIES TIMEOUT ${seconds})
    endif()
    math(EXPR watchdog "(${seconds} - 30) * 1000")
    set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT "QTEST_FUNCTION_TIMEOUT=${watchdog}")
  endforeach()
endfunction()
