# find_package(rdzv): imports rdzv::client, librdzv.so.0 (its public headers need abseil).
# find_package(rdzv COMPONENTS static) also imports rdzv::client_static, librdzv.a, which needs
# gRPC, protobuf, OpenSSL and MUNGE when the program links.
include(CMakeFindDependencyMacro)
find_dependency(absl CONFIG)
include("${CMAKE_CURRENT_LIST_DIR}/rdzvTargets.cmake")

foreach(component IN LISTS rdzv_FIND_COMPONENTS)
  if(component STREQUAL "static")
    find_dependency(Threads)
    find_dependency(Protobuf)
    find_dependency(gRPC CONFIG)
    find_dependency(OpenSSL)
    include("${CMAKE_CURRENT_LIST_DIR}/rdzvStaticTargets.cmake")
    set(rdzv_static_FOUND TRUE)
  else()
    set(rdzv_${component}_FOUND FALSE)
    if(rdzv_FIND_REQUIRED_${component})
      set(rdzv_FOUND FALSE)
      set(rdzv_NOT_FOUND_MESSAGE "rdzv has no component ${component}; the one there is: static")
    endif()
  endif()
endforeach()
