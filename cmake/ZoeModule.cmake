# zoe_add_module(NAME <name> SOURCES <files...> [DEPS <targets...>])
# Builds the module folder as OBJECT library zoe_<name> (its own target, so its
# dependencies stay visible) and adds its objects and dependencies to zoe.
function(zoe_add_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;DEPS" ${ARGN})
  set(target zoe_${M_NAME})
  add_library(${target} OBJECT ${M_SOURCES})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
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

# zoe_add_test(<name> SOURCES <files...> [LABELS <labels...>] [DEPS <targets...>] [TIMEOUT s] [DISCRETE])
# A GoogleTest executable registered with ctest (one ctest entry per executable,
# so the suite starts fast; gtest prints each case). A test labelled `engine`, or marked
# DISCRETE, gets a second entry <name>_discrete (labels: its own + `discrete`) that runs it
# on the discrete host device (ZOE_HOST_MEMORY=discrete); disabled unless ZOE_TEST_DISCRETE.
function(zoe_add_test name)
  cmake_parse_arguments(T "DISCRETE" "TIMEOUT" "SOURCES;LABELS;DEPS" ${ARGN})
  find_package(GTest REQUIRED)
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE zoe_internal GTest::gtest GTest::gtest_main ${T_DEPS})
  add_test(NAME ${name} COMMAND ${name} --gtest_brief=1)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
    ENVIRONMENT "ZOE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(T_DISCRETE OR "engine" IN_LIST T_LABELS)
    add_test(NAME ${name}_discrete COMMAND ${name} --gtest_brief=1)
    set(disabled TRUE)
    if(ZOE_TEST_DISCRETE)
      set(disabled FALSE)
    endif()
    set_tests_properties(${name}_discrete PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS};discrete"
      DISABLED ${disabled}
      ENVIRONMENT "ZOE_SOURCE_DIR=${PROJECT_SOURCE_DIR};ZOE_HOST_MEMORY=discrete;${ZOE_TEST_DISCRETE_ENV}")
  endif()
endfunction()
