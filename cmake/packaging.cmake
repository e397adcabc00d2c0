# What `cmake --install` puts where, and the three Debian packages that `cpack` makes of it:
#
#   rdzv-tools   rdzv-agent, rdzvctl                           (every compute node)
#   rdzvd        rdzvd, its systemd unit, /etc/rdzv.conf        (the head node)
#   librdzv-dev  librdzv.so.0 and librdzv.a, headers under include/rdzv, the CMake package
#                (find_package(rdzv) -> rdzv::client) and pkg-config's rdzv.pc
#
#   cmake --build --preset release && (cd build/release && cpack)   # writes build/release/*.deb
include(CMakePackageConfigHelpers)

set(RDZV_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/rdzv)

install(TARGETS rdzv-agent rdzvctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
install(TARGETS rdzvd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT server)
# For workers in enroot containers started by an agent outside them (deploy/slurm/ddp-enroot.sbatch).
install(FILES deploy/slurm/enroot-workers.conf DESTINATION ${CMAKE_INSTALL_DATADIR}/rdzv
  COMPONENT tools)

# Files that name installed paths are written at install time, when the prefix is final (cpack
# installs under /usr whatever the build's CMAKE_INSTALL_PREFIX).
function(rdzv_install_for_prefix component template destination)
  install(CODE "include(\"${PROJECT_SOURCE_DIR}/cmake/install_for_prefix.cmake\")
    rdzv_write_for_prefix(\"${PROJECT_SOURCE_DIR}/${template}\" \"${destination}\"
      \"${CMAKE_INSTALL_BINDIR}\" \"${CMAKE_INSTALL_LIBDIR}\" \"${CMAKE_INSTALL_INCLUDEDIR}\"
      \"${PROJECT_VERSION}\")"
    COMPONENT ${component})
endfunction()
rdzv_install_for_prefix(server deploy/systemd/rdzvd.service lib/systemd/system/rdzvd.service)
rdzv_install_for_prefix(server deploy/packaging/rdzv.conf SYSCONFDIR/rdzv.conf)
rdzv_install_for_prefix(dev deploy/packaging/rdzv.pc.in LIBDIR/pkgconfig/rdzv.pc)

# librdzv: the public headers keep their client/... and common/... paths under include/rdzv.
set(RDZV_PUBLIC_HEADERS client/client.h client/local_endpoint.h common/core/backoff.h common/core/host_port.h common/net.h
  common/core/rendezvous_types.h)
if(EXISTS ${PROJECT_SOURCE_DIR}/client/rdzv.h)
  list(APPEND RDZV_PUBLIC_HEADERS client/rdzv.h)
endif()
foreach(header ${RDZV_PUBLIC_HEADERS})
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/rdzv/${dir} COMPONENT dev)
endforeach()

install(TARGETS rdzv_shared EXPORT rdzvTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev NAMELINK_COMPONENT dev)
install(TARGETS rdzv_static EXPORT rdzvStaticTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
# install/strip (and cpack) leave static archives alone; their debug sections are most of them.
install(CODE "if(CMAKE_INSTALL_DO_STRIP)
    execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug
      \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/librdzv.a\")
  endif()" COMPONENT dev)
install(EXPORT rdzvTargets NAMESPACE rdzv:: DESTINATION ${RDZV_CMAKE_DIR} COMPONENT dev)
install(EXPORT rdzvStaticTargets NAMESPACE rdzv:: DESTINATION ${RDZV_CMAKE_DIR} COMPONENT dev)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/rdzvConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES cmake/rdzvConfig.cmake ${PROJECT_BINARY_DIR}/rdzvConfigVersion.cmake
  DESTINATION ${RDZV_CMAKE_DIR} COMPONENT dev)

# Debian packages, one per component. dpkg-shlibdeps finds each binary's runtime libraries
# (libgrpc++1.51, libprotobuf32, libabsl20220623, libmunge2, libssl3, ...); spdlog and fmt are
# compiled in (header-only).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME rdzv)
set(CPACK_PACKAGE_VENDOR rdzv)
set(CPACK_PACKAGE_CONTACT "rdzv maintainers <root@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Rendezvous and rank assignment for distributed PyTorch on Slurm")
# Installed under /usr with DESTDIR, so that files naming paths (the unit) name the final ones.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL tools server dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# librdzv-dev's shlibs file and the ldconfig trigger that puts librdzv.so.0 in the cache.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME rdzv-tools)
set(CPACK_DEBIAN_TOOLS_DESCRIPTION "rdzv-agent and rdzvctl for distributed PyTorch on Slurm
rdzv-agent runs under srun on every node of a job, meets the others at a rendezvous and
starts the workers with their ranks; rdzvctl asks rdzvd about jobs.")
set(CPACK_DEBIAN_TOOLS_PACKAGE_SUGGESTS "rdzvd, munge")

set(CPACK_DEBIAN_SERVER_PACKAGE_NAME rdzvd)
set(CPACK_DEBIAN_SERVER_DESCRIPTION "rdzv rendezvous server for rdzv-agent jobs
rdzvd serves the rendezvous of every rdzv-agent job of a cluster from its head node; enable it
with systemctl enable --now rdzvd. /etc/rdzv.conf sets the agents' defaults.")
set(CPACK_DEBIAN_SERVER_PACKAGE_RECOMMENDS munge)
set(CPACK_DEBIAN_SERVER_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/deploy/packaging/conffiles)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME librdzv-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_DESCRIPTION "librdzv, the rdzv client library, for custom launchers
librdzv.so.0 and librdzv.a, headers, the CMake package (find_package(rdzv), target
rdzv::client) and pkg-config's rdzv. Linking librdzv.a statically also needs the -dev
packages it recommends.")
# The headers include abseil's; the static archive also needs these at link time.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libabsl-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS
  "pkg-config, libgrpc++-dev, libprotobuf-dev, libmunge-dev, libssl-dev")

include(CPack)
