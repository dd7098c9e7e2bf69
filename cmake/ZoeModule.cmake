# zoe_add_module(NAME <name> SOURCES <files...> [DEPS <targets...>])
# Builds the module folder as OBJECT library zoe_<name> (its own target, so its
# dependencies stay visible) and adds its objects and dependencies to zoe. DEPS are the
# libraries it uses (Debian packages, CUDA); the modules it may include come from its row of
# the dependency rule (cmake/ZoeLayering.cmake): its only include path is its include view,
# and it links the module targets of its row.
function(zoe_add_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;DEPS" ${ARGN})
  set(target zoe_${M_NAME})
  add_library(${target} OBJECT ${M_SOURCES})
  file(RELATIVE_PATH module ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  zoe_layering_view(${module} view)
  target_include_directories(${target} PRIVATE ${view})
  # __FILE__ of a header reached through the view is its repository path, as for sources (the
  # second form: ccache's path relative to the build dir). The last matching map wins.
  file(RELATIVE_PATH view_from_build ${PROJECT_BINARY_DIR} ${view})
  foreach(map ${view}/= ${view_from_build}/=)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-fmacro-prefix-map=${map}>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fmacro-prefix-map=${map}>)
  endforeach()
  foreach(dep IN LISTS ZOE_LAYERING_DEPS_${module})
    get_filename_component(dep_name ${dep} NAME)
    if(TARGET zoe_${dep_name} AND NOT dep MATCHES "^zoe/")
      target_link_libraries(${target} PRIVATE zoe_${dep_name})
    endif()
  endforeach()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  if(M_DEPS)
    target_link_libraries(${target} PUBLIC ${M_DEPS})
    target_link_libraries(zoe PRIVATE ${M_DEPS})
    target_link_libraries(zoe_internal INTERFACE ${M_DEPS})
  endif()
  target_sources(zoe PRIVATE $<TARGET_OBJECTS:${target}>)
endfunction()

# zoe_add_children(<folder>): add_subdirectory for every child folder with a CMakeLists.txt.
function(zoe_add_children folder)
  file(GLOB children LIST_DIRECTORIES true ${PROJECT_SOURCE_DIR}/${folder}/*)
  list(SORT children)
  foreach(child IN LISTS children)
    if(IS_DIRECTORY ${child} AND EXISTS ${child}/CMakeLists.txt)
      add_subdirectory(${child})
    endif()
  endforeach()
endfunction()

# zoe_scaled_timeout(<out-var> <seconds>): a ctest TIMEOUT of <seconds> in a plain build, times
# ZOE_TEST_TIMEOUT_SCALE under a sanitizer (the code runs slower, the test is the same).
function(zoe_scaled_timeout out seconds)
  math(EXPR scaled "${seconds} * ${ZOE_TEST_TIMEOUT_SCALE}")
  set(${out} ${scaled} PARENT_SCOPE)
endfunction()

# zoe_add_test(<name> SOURCES <files...> [LABELS <labels...>] [DEPS <targets...>] [TIMEOUT s]
#               [PARTS <part>=<gtest filter>...] [DISCRETE])
# A GoogleTest executable registered with ctest, one entry per executable (the suite starts
# fast; gtest prints each case). Each PART is a separate entry <name>_<part> running only the
# cases its filter selects (with the label <part>), and <name> runs the rest: put the cases that
# need something a machine may lack (a GPU: PARTS "gpu=*OnGpu.*") in a part, so that every entry
# either runs or skips as a whole. tests/gtest_main.cpp exits 77 when every case of an entry
# skipped, which ctest reports as skipped (SKIP_RETURN_CODE), and fails an entry whose filter
# selects nothing. The entries of one executable run one at a time (RESOURCE_LOCK): they may
# share files in the build tree. A test labelled `engine`, or marked DISCRETE, gets a second
# entry <name>_discrete (labels: its own + `discrete`) that runs its main entry's cases on the
# discrete host device (ZOE_HOST_MEMORY=discrete); disabled unless ZOE_TEST_DISCRETE.
function(zoe_add_test name)
  cmake_parse_arguments(T "DISCRETE" "TIMEOUT" "SOURCES;LABELS;DEPS;PARTS" ${ARGN})
  find_package(GTest REQUIRED)
  if(NOT TARGET zoe_gtest_main)
    add_library(zoe_gtest_main STATIC ${PROJECT_SOURCE_DIR}/tests/gtest_main.cpp)
    target_link_libraries(zoe_gtest_main PUBLIC GTest::gtest)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE zoe_internal GTest::gtest zoe_gtest_main ${T_DEPS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  zoe_scaled_timeout(T_TIMEOUT ${T_TIMEOUT})
  set(rest "")
  foreach(part IN LISTS T_PARTS)
    if(NOT part MATCHES "^([A-Za-z0-9_]+)=(.+)$")
      message(FATAL_ERROR "zoe_add_test(${name}): PARTS entry '${part}' is not <part>=<gtest filter>")
    endif()
    set(part_name ${CMAKE_MATCH_1})
    set(filter ${CMAKE_MATCH_2})
    add_test(NAME ${name}_${part_name} COMMAND ${name} --gtest_brief=1 --gtest_filter=${filter})
    set(labels ${T_LABELS} ${part_name})
    list(REMOVE_DUPLICATES labels)
    set_tests_properties(${name}_${part_name} PROPERTIES LABELS "${labels}")
    list(APPEND entries ${name}_${part_name})
    string(APPEND rest ":${filter}")
  endforeach()
  set(main_args --gtest_brief=1)
  if(rest)
    string(SUBSTRING "${rest}" 1 -1 rest)
    list(APPEND main_args --gtest_filter=-${rest})
  endif()
  add_test(NAME ${name} COMMAND ${name} ${main_args})
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  list(APPEND entries ${name})
  set_tests_properties(${entries} PROPERTIES TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
    RESOURCE_LOCK ${name} ENVIRONMENT "ZOE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(T_DISCRETE OR "engine" IN_LIST T_LABELS)
    add_test(NAME ${name}_discrete COMMAND ${name} ${main_args})
    set(disabled TRUE)
    if(ZOE_TEST_DISCRETE)
      set(disabled FALSE)
    endif()
    set_tests_properties(${name}_discrete PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS};discrete"
      DISABLED ${disabled} SKIP_RETURN_CODE 77 RESOURCE_LOCK ${name}
      ENVIRONMENT "ZOE_SOURCE_DIR=${PROJECT_SOURCE_DIR};ZOE_HOST_MEMORY=discrete;${ZOE_TEST_DISCRETE_ENV}")
  endif()
endfunction()
