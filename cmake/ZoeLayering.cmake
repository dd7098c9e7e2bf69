# The dependency rule, read from its one table: docs/architecture.md, section "Dependency rule".
# Each row is `| `module` | `dep` `dep` ... | why |`; a module is a folder of the repository
# ("src/core", "io") or one public header as it is included ("zoe/engine.hpp"). Rows come lowest
# first and may name only rows above them, so the graph has no cycle.
#
# Sets, for every module M of the table:
#   ZOE_LAYERING_MODULES      the modules, in table order
#   ZOE_LAYERING_DEPS_<M>     its row: what its files may include besides M itself
#   ZOE_LAYERING_REACH_<M>    M, its row, and what those reach in turn (what its headers need)
# zoe_layering_view(<M> <out-var>) makes the include folder of M (see below).
# tests/layering/check_layering.py reads the same table and checks every include against the row.

set(ZOE_LAYERING_TABLE ${PROJECT_SOURCE_DIR}/docs/architecture.md)
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${ZOE_LAYERING_TABLE})

file(READ ${ZOE_LAYERING_TABLE} _zoe_doc)
string(FIND "${_zoe_doc}" "\n## Dependency rule\n" _zoe_at)
if(_zoe_at EQUAL -1)
  message(FATAL_ERROR "${ZOE_LAYERING_TABLE}: no section \"## Dependency rule\" (the layering table)")
endif()
string(SUBSTRING "${_zoe_doc}" ${_zoe_at} -1 _zoe_doc)
string(SUBSTRING "${_zoe_doc}" 1 -1 _zoe_doc)
string(FIND "${_zoe_doc}" "\n## " _zoe_end)
if(NOT _zoe_end EQUAL -1)
  string(SUBSTRING "${_zoe_doc}" 0 ${_zoe_end} _zoe_doc)
endif()
# The text becomes a list of lines: its own ';' and brackets would split or join list elements.
string(REGEX REPLACE "[][;]" "," _zoe_doc "${_zoe_doc}")
string(REPLACE "\n" ";" _zoe_lines "${_zoe_doc}")

set(ZOE_LAYERING_MODULES "")
foreach(line IN LISTS _zoe_lines)
  if(NOT line MATCHES "^\\| *`([^`]+)` *\\|([^|]*)\\|")
    continue()  # prose, the header row or the |---| line
  endif()
  set(module ${CMAKE_MATCH_1})
  string(REGEX MATCHALL "`[^`]+`" deps "${CMAKE_MATCH_2}")
  list(TRANSFORM deps REPLACE "`" "")
  if(module IN_LIST ZOE_LAYERING_MODULES)
    message(FATAL_ERROR "${ZOE_LAYERING_TABLE}: module `${module}` has two rows")
  endif()
  set(reach ${module})
  foreach(dep IN LISTS deps)
    if(NOT dep IN_LIST ZOE_LAYERING_MODULES)
      message(FATAL_ERROR "${ZOE_LAYERING_TABLE}: `${module}` may include `${dep}`, which is no row above it "
                          "(rows come lowest first)")
    endif()
    list(APPEND reach ${ZOE_LAYERING_REACH_${dep}})
  endforeach()
  list(REMOVE_DUPLICATES reach)
  list(APPEND ZOE_LAYERING_MODULES ${module})
  set(ZOE_LAYERING_DEPS_${module} ${deps})
  set(ZOE_LAYERING_REACH_${module} ${reach})
endforeach()
if(NOT ZOE_LAYERING_MODULES)
  message(FATAL_ERROR "${ZOE_LAYERING_TABLE}: the section \"Dependency rule\" has no table rows")
endif()

# Where an include spelled `entry` lives in the source tree.
function(_zoe_layering_source entry out)
  if(entry MATCHES "^zoe/")
    set(${out} ${PROJECT_SOURCE_DIR}/include/${entry} PARENT_SCOPE)
  else()
    set(${out} ${PROJECT_SOURCE_DIR}/${entry} PARENT_SCOPE)
  endif()
endfunction()

foreach(module IN LISTS ZOE_LAYERING_MODULES)
  _zoe_layering_source(${module} path)
  if(NOT EXISTS ${path})
    message(FATAL_ERROR "${ZOE_LAYERING_TABLE}: module `${module}` names no file or folder (${path})")
  endif()
endforeach()

# zoe_layering_view(<module> <out-var>): <build>/include-views/<module's last name>/, a folder
# of symbolic links to exactly what <module> reaches (folders at their repository path, public
# headers under zoe/), remade at every configure. As a module's only include path it makes an
# include outside the rule fail to compile. Sets <out-var> to the folder.
function(zoe_layering_view module out)
  if(NOT module IN_LIST ZOE_LAYERING_MODULES)
    message(FATAL_ERROR "module `${module}` has no row in the table of ${ZOE_LAYERING_TABLE}")
  endif()
  get_filename_component(name ${module} NAME)
  set(view ${PROJECT_BINARY_DIR}/include-views/${name})
  file(REMOVE_RECURSE ${view})  # removes the links, never what they point to
  foreach(entry IN LISTS ZOE_LAYERING_REACH_${module})
    _zoe_layering_source(${entry} source)
    get_filename_component(parent ${view}/${entry} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${source} ${view}/${entry} SYMBOLIC)
  endforeach()
  set(${out} ${view} PARENT_SCOPE)
endfunction()
