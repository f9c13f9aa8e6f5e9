# cmake -DGUI=<batchpilot> -P gui_without_display.cmake
# The window's program where no display is set (a server, an ssh session without -X): --help and
# --version print and exit 0, and without them it says why no window opens (exit 1) rather than
# Qt aborting (exit 134, for --help too).
cmake_minimum_required(VERSION 3.20)
set(no_display env -u DISPLAY -u WAYLAND_DISPLAY -u QT_QPA_PLATFORM)
execute_process(COMMAND ${no_display} "${GUI}" --help RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0 OR NOT out MATCHES "--demo" OR NOT out MATCHES "--quit-after")
  message(FATAL_ERROR "batchpilot --help without a display: exit ${code}\n${out}${err}")
endif()
execute_process(COMMAND ${no_display} "${GUI}" --version RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0 OR NOT out MATCHES "BatchPilot [0-9]")
  message(FATAL_ERROR "batchpilot --version without a display: exit ${code}\n${out}${err}")
endif()
execute_process(COMMAND ${no_display} "${GUI}" --no-such-flag RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(code EQUAL 0 OR NOT err MATCHES "no-such-flag")
  message(FATAL_ERROR "batchpilot --no-such-flag without a display: exit ${code}\n${out}${err}")
endif()
execute_process(COMMAND ${no_display} "${GUI}" RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 1 OR NOT err MATCHES "there is no display to open the window on")
  message(FATAL_ERROR "batchpilot without a display: exit ${code}, expected 1 and a message\n${out}${err}")
endif()
message(STATUS "without a display: --help, --version and a bad flag answered; no window explained")
