# cmake -DBUILD_DIR=... -DTARGET=... -DEXPECT=... -P expect_failure.cmake
# Builds TARGET and passes only when the build fails with EXPECT in its output (one of its
# "|"-separated forms: each compiler words it its own way): a failure for another reason (a
# broken build tree) is not mistaken for the layering rule holding.
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}"
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(result EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled: a ui/ file can include torch, so the layering is not enforced")
endif()
string(REPLACE "|" ";" forms "${EXPECT}")
foreach(form IN LISTS forms)
  string(FIND "${out}${err}" "${form}" at)
  if(NOT at EQUAL -1)
    message(STATUS "${TARGET} does not compile, as it must: ${form}")
    return()
  endif()
endforeach()
message(FATAL_ERROR "${TARGET} failed, but not for the expected reason (${EXPECT}):\n${out}${err}")
