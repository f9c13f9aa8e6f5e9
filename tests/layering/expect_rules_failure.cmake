# cmake -DRULES=<include_rules.cmake> -DTREE=<source tree> "-DEXPECT=<text>|<text>..."
#       -P expect_rules_failure.cmake
# Runs the include rules on a tree that breaks them and passes only when they fail, naming every
# expected problem: a rule that never fires would otherwise pass for ever.
cmake_minimum_required(VERSION 3.20)
execute_process(COMMAND "${CMAKE_COMMAND}" "-DSOURCE_DIR=${TREE}" -P "${RULES}"
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(result EQUAL 0)
  message(FATAL_ERROR "the include rules passed on ${TREE}, which breaks them:\n${out}${err}")
endif()
string(REPLACE "|" ";" expected "${EXPECT}")
foreach(text IN LISTS expected)
  string(FIND "${out}${err}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the include rules failed, but did not report \"${text}\":\n${out}${err}")
  endif()
endforeach()
message(STATUS "the include rules catch every leak in ${TREE}")
