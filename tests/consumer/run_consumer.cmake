# ctest consumer_installed (see CMakeLists.txt here): installs the build tree into a temp
# prefix, runs the installed zoe-estimate, builds tests/consumer/project against the prefix as
# a trainer would, runs it and compares its output with REFERENCE byte for byte.
# -D: SOURCE_DIR, BUILD_DIR, WORK_DIR, REFERENCE, GENERATOR, BINDIR, SANITIZE_FLAGS (the
# tree's sanitizer flags, a ;-list, empty without one: the consumer is built with them too, as
# a program linking a sanitized libzoe must be; ASan refuses to start otherwise).
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${what}: ${out}${err}")
  if(rc)
    message(FATAL_ERROR "${what} failed (${rc}): ${ARGN}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# The installed tool finds libzoe through its own RPATH ($ORIGIN/../lib), with nothing else set.
run("installed zoe-estimate" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
  ${prefix}/${BINDIR}/zoe-estimate --params 1B --world-size 8 --gpu-memory 80GB --host-memory 512GB)
if(NOT out MATCHES "recommendation")
  message(FATAL_ERROR "installed zoe-estimate printed no recommendation")
endif()

set(sanitize)
if(SANITIZE_FLAGS)
  string(REPLACE ";" " " flags "${SANITIZE_FLAGS}")
  set(sanitize "-DCMAKE_CXX_FLAGS=${flags}" "-DCMAKE_EXE_LINKER_FLAGS=${flags}")
endif()
run("consumer configure" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer/project -B ${WORK_DIR}/build
  -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix} ${sanitize})
run("consumer build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run("consumer run" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
  ${WORK_DIR}/build/consumer ${WORK_DIR}/installed.bin ${WORK_DIR}/nvme)
if(NOT out MATCHES "zoe consumer ok")
  message(FATAL_ERROR "the consumer did not report success")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK_DIR}/installed.bin ${REFERENCE}
  RESULT_VARIABLE differ)
if(differ)
  message(FATAL_ERROR "the installed consumer's losses and parameters (${WORK_DIR}/installed.bin) "
                      "differ from the build tree's run (${REFERENCE})")
endif()
file(SIZE ${REFERENCE} bytes)
message(STATUS "installed consumer = build-tree run, ${bytes} bytes bitwise")
