# Fails when a committed reference is not what the CLI prints.
#   cmake -DCLI=<batchpilot-cli> -DDOC=<docs/reference/cli-help.txt> [-DFLAG=--help] -P cli_reference.cmake
# scripts/cli-reference writes the files from `batchpilot-cli --help` and `--options-reference`.
# The text depends on neither the terminal nor the machine (CLI11 wraps at a fixed column), so it
# is compared byte for byte.
cmake_minimum_required(VERSION 3.20)
if(NOT CLI OR NOT DOC)
  message(FATAL_ERROR "usage: cmake -DCLI=<batchpilot-cli> -DDOC=<cli-help.txt> [-DFLAG=--help] -P cli_reference.cmake")
endif()
if(NOT FLAG)
  set(FLAG --help)
endif()
execute_process(COMMAND "${CLI}" ${FLAG} OUTPUT_VARIABLE printed ERROR_VARIABLE errors RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR printed STREQUAL "")
  message(FATAL_ERROR "\"${CLI}\" ${FLAG} failed (${status}):\n${errors}")
endif()
if(NOT EXISTS "${DOC}")
  message(FATAL_ERROR "${DOC} is missing: run scripts/cli-reference to write it from batchpilot-cli ${FLAG}")
endif()
file(READ "${DOC}" committed)
if(printed STREQUAL committed)
  message(STATUS "${DOC} is what batchpilot-cli ${FLAG} prints")
  return()
endif()

# Name the first line that differs (lines are cut at "\n" by hand: the help text holds semicolons,
# which a CMake list would split on).
set(line 1)
while(TRUE)
  foreach(side printed committed)
    string(FIND "${${side}}" "\n" ${side}_end)
    if(${side}_end EQUAL -1)
      set(${side}_line "${${side}}")
    else()
      string(SUBSTRING "${${side}}" 0 ${${side}_end} ${side}_line)
    endif()
    if("${${side}}" STREQUAL "")
      set(${side}_line "(end of the text)")
    endif()
  endforeach()
  if(NOT printed_line STREQUAL committed_line OR printed_end EQUAL -1 OR committed_end EQUAL -1)
    break()
  endif()
  foreach(side printed committed)
    math(EXPR ${side}_end "${${side}_end} + 1")
    string(SUBSTRING "${${side}}" ${${side}_end} -1 ${side})
  endforeach()
  math(EXPR line "${line} + 1")
endwhile()
message(FATAL_ERROR "${DOC} is not what batchpilot-cli ${FLAG} prints; first difference at line ${line}:\n"
                    "  committed: ${committed_line}\n"
                    "  printed:   ${printed_line}\n"
                    "Run scripts/cli-reference (it writes the file from ${FLAG}) and commit the result.")
