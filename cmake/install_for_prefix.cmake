# Run by `cmake --install` and cpack (see packaging.cmake): writes a file that names installed
# paths once the install prefix is known. In the template, @prefix@, @bindir@, @libdir@,
# @includedir@ and @version@ are replaced, and so is =/usr/local/bin/ (ExecStart= in the
# systemd unit, which names the hand-install path). The destination starts with SYSCONFDIR
# (/etc under the /usr prefix, PREFIX/etc otherwise), LIBDIR, or is relative to the prefix.
function(rdzv_write_for_prefix template destination bindir libdir includedir version)
  set(prefix "${CMAKE_INSTALL_PREFIX}")
  if(prefix STREQUAL "/usr")
    set(sysconfdir /etc)
  else()
    set(sysconfdir "${prefix}/etc")
  endif()
  string(REGEX REPLACE "^SYSCONFDIR" "${sysconfdir}" destination "${destination}")
  string(REGEX REPLACE "^LIBDIR" "${prefix}/${libdir}" destination "${destination}")
  if(NOT IS_ABSOLUTE "${destination}")
    set(destination "${prefix}/${destination}")
  endif()
  set(bindir "${prefix}/${bindir}")
  set(libdir "${prefix}/${libdir}")
  set(includedir "${prefix}/${includedir}")

  file(READ "${template}" text)
  string(REPLACE "=/usr/local/bin/" "=${bindir}/" text "${text}")
  string(CONFIGURE "${text}" text @ONLY)
  message(STATUS "Installing: $ENV{DESTDIR}${destination}")
  file(WRITE "$ENV{DESTDIR}${destination}" "${text}")
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${destination}")
  set(CMAKE_INSTALL_MANIFEST_FILES "${CMAKE_INSTALL_MANIFEST_FILES}" PARENT_SCOPE)
endfunction()
