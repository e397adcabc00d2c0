# The self-contained rdzv-agent and rdzvctl: the same objects as the programs in bin/, linked
# statically (glibc, libstdc++, gRPC, protobuf, abseil, OpenSSL, MUNGE, c-ares, re2, zlib), so
# that they run in any x86_64 Linux image with nothing of ours installed: `srun
# --container-image=...` (pyxis/enroot) bind-mounts them into an image someone else built.
#
#   build/<preset>/container/rdzv-agent, build/<preset>/container/rdzvctl   stripped
#   build/<preset>/container-debug/*.debug                                  their debug info
#   /usr/lib/rdzv/container/ (the rdzv-tools package)                       installed
#
# A statically linked glibc resolves host names and users only through the lookups built into it
# (files, dns); common/self_contained_runtime.cc pins those, so that an image's nsswitch.conf
# never makes it load a shared NSS module of another glibc. See docs/containers.md.
#
# The archives come from the same targets as the dynamic programs: each of our static libraries
# is linked by file, and each imported shared library of theirs (gRPC::grpc++, absl::*,
# OpenSSL::SSL, PkgConfig::MUNGE, ...) by the static archive beside it.

# The archive beside a shared library file: /usr/lib/x86_64-linux-gnu/libfoo.so.1.2 -> libfoo.a.
function(_rdzv_static_archive_of file out)
  get_filename_component(dir "${file}" DIRECTORY)
  get_filename_component(name "${file}" NAME)
  string(REGEX REPLACE "\\.so(\\.[0-9]+)*$" ".a" archive "${name}")
  if(NOT archive MATCHES "\\.a$")
    set(${out} "" PARENT_SCOPE)
    return()
  endif()
  if(NOT EXISTS "${dir}/${archive}")
    message(FATAL_ERROR "the self-contained rdzv-agent links ${dir}/${archive} (the static "
      "form of ${file}), which is missing: install the -dev package that holds it, or configure "
      "with -DRDZV_SELF_CONTAINED=OFF")
  endif()
  set(${out} "${dir}/${archive}" PARENT_SCOPE)
endfunction()

# The file an imported library target names, whatever configuration it was imported for.
function(_rdzv_imported_file target out)
  set(file "")
  foreach(prop IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_RELWITHDEBINFO IMPORTED_LOCATION_NONE
      IMPORTED_LOCATION_NOCONFIG IMPORTED_LOCATION_DEBUG IMPORTED_LOCATION)
    get_target_property(file ${target} ${prop})
    if(file)
      break()
    endif()
  endforeach()
  if(NOT file)
    set(file "")
  endif()
  set(${out} "${file}" PARENT_SCOPE)
endfunction()

# Walks the link graph under `item`, appending to the lists in the caller's scope:
# _rdzv_sc_archives (files), _rdzv_sc_objects (object libraries), _rdzv_sc_system (-l names and
# flags), _rdzv_sc_seen.
function(_rdzv_walk item)
  # $<LINK_ONLY:x> and $<BUILD_INTERFACE:x> are x; other generator expressions (install paths)
  # do not apply to this build.
  if(item MATCHES "^\\$<(LINK_ONLY|BUILD_INTERFACE):(.*)>$")
    set(item "${CMAKE_MATCH_2}")
  elseif(item MATCHES "^\\$<")
    return()
  endif()
  if(item IN_LIST _rdzv_sc_seen)
    return()
  endif()
  list(APPEND _rdzv_sc_seen "${item}")

  if(TARGET ${item})
    get_target_property(aliased ${item} ALIASED_TARGET)
    if(aliased)
      set(item ${aliased})
    endif()
    get_target_property(type ${item} TYPE)
    get_target_property(imported ${item} IMPORTED)
    if(imported AND NOT type STREQUAL "INTERFACE_LIBRARY")
      _rdzv_imported_file(${item} file)
      if(file)
        _rdzv_static_archive_of("${file}" archive)
        if(archive)
          list(APPEND _rdzv_sc_archives "${archive}")
        endif()
      endif()
    elseif(type STREQUAL "STATIC_LIBRARY")
      list(APPEND _rdzv_sc_archives "$<TARGET_FILE:${item}>")
      list(APPEND _rdzv_sc_targets ${item})
    elseif(type STREQUAL "OBJECT_LIBRARY")
      list(APPEND _rdzv_sc_objects "$<TARGET_OBJECTS:${item}>")
      list(APPEND _rdzv_sc_targets ${item})
    endif()
    get_target_property(deps ${item} INTERFACE_LINK_LIBRARIES)
    if(deps)
      foreach(dep IN LISTS deps)
        _rdzv_walk("${dep}")
      endforeach()
    endif()
  elseif(item MATCHES "^/.*\\.so(\\.[0-9]+)*$")
    _rdzv_static_archive_of("${item}" archive)
    list(APPEND _rdzv_sc_archives "${archive}")
  elseif(item MATCHES "^-")
    list(APPEND _rdzv_sc_system "${item}")
  elseif(NOT item MATCHES "::")
    list(APPEND _rdzv_sc_system "-l${item}")
  endif()
  foreach(var _rdzv_sc_archives _rdzv_sc_objects _rdzv_sc_system _rdzv_sc_seen _rdzv_sc_targets)
    set(${var} "${${var}}" PARENT_SCOPE)
  endforeach()
endfunction()

# rdzv_self_contained(NAME MAIN main_object_library): container/NAME, linked statically from
# main_object_library (the program's main) and everything it links.
function(rdzv_self_contained name)
  cmake_parse_arguments(ARG "" "MAIN" "" ${ARGN})
  set(_rdzv_sc_archives "")
  set(_rdzv_sc_objects "")
  set(_rdzv_sc_system "")
  set(_rdzv_sc_seen "")
  set(_rdzv_sc_targets "")
  _rdzv_walk(${ARG_MAIN})
  list(REMOVE_DUPLICATES _rdzv_sc_archives)
  list(REMOVE_DUPLICATES _rdzv_sc_system)

  set(target ${name}-self-contained)
  add_executable(${target} ${_rdzv_sc_objects} $<TARGET_OBJECTS:rdzv_self_contained_runtime>)
  set_target_properties(${target} PROPERTIES OUTPUT_NAME ${name}
    RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/container LINKER_LANGUAGE CXX)
  add_dependencies(${target} ${_rdzv_sc_targets})
  # One group, so that the order of the archives does not matter.
  target_link_options(${target} PRIVATE -static -pthread)
  target_link_libraries(${target} PRIVATE -Wl,--start-group ${_rdzv_sc_archives}
    ${_rdzv_sc_system} -Wl,--end-group)
  # Stripped; the debug information beside it, found by gdb through the debug link.
  set(debug_dir ${PROJECT_BINARY_DIR}/container-debug)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -E make_directory ${debug_dir}
    COMMAND ${CMAKE_OBJCOPY} --only-keep-debug $<TARGET_FILE:${target}> ${debug_dir}/${name}.debug
    COMMAND ${CMAKE_STRIP} --strip-all $<TARGET_FILE:${target}>
    COMMAND ${CMAKE_OBJCOPY} --add-gnu-debuglink=${debug_dir}/${name}.debug $<TARGET_FILE:${target}>
    VERBATIM)
  # A fixed path, the same on every distribution, to bind-mount into containers.
  install(PROGRAMS $<TARGET_FILE:${target}> DESTINATION lib/rdzv/container COMPONENT tools)
endfunction()

# What a statically linked program sets up before main (common/self_contained_runtime.cc).
# Its objects are named, not linked as a target, so that no shared library comes with them.
add_library(rdzv_self_contained_runtime OBJECT ${PROJECT_SOURCE_DIR}/common/self_contained_runtime.cc)
target_include_directories(rdzv_self_contained_runtime PRIVATE ${OPENSSL_INCLUDE_DIR})
rdzv_strict(rdzv_self_contained_runtime)

rdzv_self_contained(rdzv-agent MAIN rdzv_agent_main)
rdzv_self_contained(rdzvctl MAIN rdzvctl_main)
