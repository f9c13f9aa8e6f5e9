# cmake -DBUILD_DIR=... -DTARGET=... -DEXPECT=... -P expect_failure.cmake
# Builds TARGET and passes only when the build fails with EXPECT in its output: a failure for
# another reason (a broken build tree) is not mistaken for the layering rule holding.
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}"
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(result EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled: a ui/ file can include torch, so the layering is not enforced")
endif()
string(FIND "${out}${err}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${TARGET} failed, but not for the expected reason (${EXPECT}):\n${out}${err}")
endif()
message(STATUS "${TARGET} does not compile, as it must: ${EXPECT}")
