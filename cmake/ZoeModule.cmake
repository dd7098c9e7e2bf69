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

# zoe_add_test(<name> SOURCES <files...> [LABELS <labels...>] [DEPS <targets...>] [TIMEOUT s])
# A GoogleTest executable registered with ctest (one ctest entry per executable,
# so the suite starts fast; gtest prints each case).
function(zoe_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LABELS;DEPS" ${ARGN})
  find_package(GTest REQUIRED)
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE zoe_internal GTest::gtest GTest::gtest_main ${T_DEPS})
  add_test(NAME ${name} COMMAND ${name} --gtest_brief=1)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
    ENVIRONMENT "ZOE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
