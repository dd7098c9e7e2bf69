# Builds tests/fuzz/project with clang (-fsanitize=fuzzer,address,undefined), replays every seed
# of CORPUS, then runs FUZZER for FUZZ_SECONDS. Fails on any crash, leak, sanitizer report or
# exception other than the one its parser documents (zoe::ConfigError, zoe::CorruptionError).
# FUZZER (default config_fuzzer), CORPUS (default tests/config/corpus), DICT (optional),
# MAX_LEN (default 4096).
if(NOT FUZZER)
  set(FUZZER config_fuzzer)
endif()
if(NOT CORPUS)
  set(CORPUS ${SOURCE_DIR}/tests/config/corpus)
endif()
if(NOT MAX_LEN)
  set(MAX_LEN 4096)
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/fuzz/project -B ${WORK_DIR}/build
  -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CLANGXX} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_SOURCE_DIR=${SOURCE_DIR}
  RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz project configure failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build --target ${FUZZER} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz project build failed: ${rc}")
endif()
file(GLOB seeds ${CORPUS}/*)
execute_process(COMMAND ${WORK_DIR}/build/${FUZZER} ${seeds} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "${FUZZER} failed on a seed of ${CORPUS}: ${rc}")
endif()
# New inputs go to the first directory (a scratch copy), never into the source tree.
file(REMOVE_RECURSE ${WORK_DIR}/corpus-${FUZZER})
file(MAKE_DIRECTORY ${WORK_DIR}/corpus-${FUZZER})
set(dict_arg "")
if(DICT)
  set(dict_arg -dict=${DICT})
endif()
execute_process(COMMAND ${WORK_DIR}/build/${FUZZER} -max_total_time=${FUZZ_SECONDS} -max_len=${MAX_LEN}
  -rss_limit_mb=2048 ${dict_arg} -artifact_prefix=${WORK_DIR}/${FUZZER}-
  ${WORK_DIR}/corpus-${FUZZER} ${CORPUS} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "${FUZZER} found a failure: ${rc} (the input is in ${WORK_DIR}/${FUZZER}-crash-*)")
endif()
