# Builds tests/safetensors/fuzz with clang (-fsanitize=fuzzer,address,undefined), replays every
# file of tests/safetensors/corpus, then fuzzes for FUZZ_SECONDS. Fails on any crash, leak,
# sanitizer report, abort (a parsed header the writer does not reproduce) or exception other
# than zoe::CorruptionError. A longer run by hand:
#   build/tests/safetensors/fuzz-work/build/safetensors_fuzzer -max_total_time=600 DIR tests/safetensors/corpus
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/safetensors/fuzz -B ${WORK_DIR}/build
  -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CLANGXX} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_SOURCE_DIR=${SOURCE_DIR}
  RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "safetensors fuzz project configure failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "safetensors fuzz project build failed: ${rc}")
endif()
file(GLOB seeds ${SOURCE_DIR}/tests/safetensors/corpus/*)
execute_process(COMMAND ${WORK_DIR}/build/safetensors_fuzzer ${seeds} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "safetensors_fuzzer failed on a file of tests/safetensors/corpus: ${rc}")
endif()
# New inputs go to the first directory (a scratch copy), never into the source tree.
file(REMOVE_RECURSE ${WORK_DIR}/corpus)
file(MAKE_DIRECTORY ${WORK_DIR}/corpus)
execute_process(COMMAND ${WORK_DIR}/build/safetensors_fuzzer -max_total_time=${FUZZ_SECONDS} -max_len=4096
  -rss_limit_mb=2048 -dict=${SOURCE_DIR}/tests/safetensors/fuzz/safetensors.dict -artifact_prefix=${WORK_DIR}/
  ${WORK_DIR}/corpus ${SOURCE_DIR}/tests/safetensors/corpus RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "safetensors_fuzzer found a failure: ${rc} (the input is in ${WORK_DIR}/crash-*)")
endif()
