# batchpilot_add_test(<unit> SOURCE <file> LIBS <targets...> GROUP <group> [TIMEOUT s] [COST s] [TORCH]
#                     [NO_TEST])
# Builds one QtTest executable per unit and registers it with CTest as "<group>.<unit>".
function(batchpilot_add_test name)
  cmake_parse_arguments(ARG "TORCH;NO_TEST" "SOURCE;TIMEOUT;GROUP;COST" "LIBS" ${ARGN})
  set(target tst_${ARG_GROUP}_${name})
  add_executable(${target} ${ARG_SOURCE})
  target_link_libraries(${target} PRIVATE batchpilot_settings Qt6::Test ${ARG_LIBS})
  if(ARG_TORCH)
    target_precompile_headers(${target} REUSE_FROM batchpilot_torch_pch)
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
                       ENVIRONMENT "QT_QPA_PLATFORM=offscreen;BATCHPILOT_RUNS_DIR=${CMAKE_BINARY_DIR}/test-runs")
endfunction()
