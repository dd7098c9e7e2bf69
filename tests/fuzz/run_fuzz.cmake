# Builds tests/fuzz/project with clang (-fsanitize=fuzzer,address,undefined), replays every seed
# of tests/config/corpus, then fuzzes for FUZZ_SECONDS. Fails on any crash, leak, sanitizer
# report or exception other than zoe::ConfigError.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/fuzz/project -B ${WORK_DIR}/build
  -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CLANGXX} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_SOURCE_DIR=${SOURCE_DIR}
  RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz project configure failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz project build failed: ${rc}")
endif()
file(GLOB seeds ${SOURCE_DIR}/tests/config/corpus/*)
execute_process(COMMAND ${WORK_DIR}/build/config_fuzzer ${seeds} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "config_fuzzer failed on a seed of tests/config/corpus: ${rc}")
endif()
# New inputs go to the first directory (a scratch copy), never into the source tree.
file(REMOVE_RECURSE ${WORK_DIR}/corpus)
file(MAKE_DIRECTORY ${WORK_DIR}/corpus)
execute_process(COMMAND ${WORK_DIR}/build/config_fuzzer -max_total_time=${FUZZ_SECONDS} -max_len=4096
  -rss_limit_mb=2048 -dict=${SOURCE_DIR}/tests/fuzz/config.dict -artifact_prefix=${WORK_DIR}/
  ${WORK_DIR}/corpus ${SOURCE_DIR}/tests/config/corpus RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "config_fuzzer found a failure: ${rc} (the input is in ${WORK_DIR}/crash-*)")
endif()
