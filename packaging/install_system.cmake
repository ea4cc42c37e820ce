# Runs at install time (install(CODE) in packaging/CMakeLists.txt sets GJ_SOURCE_DIR,
# GJ_BINARY_DIR and GJ_SBINDIR): places the service unit, the sysusers.d and tmpfiles.d files
# and the configuration. The paths follow the prefix of this install, not the configure's, so
# that `cmake --install --prefix /usr` and CPack (prefix /usr) write /usr/sbin and /etc into
# the unit while a default install writes /usr/local/sbin and /usr/local/etc. systemd reads
# units, sysusers.d and tmpfiles.d under /usr/local/lib as under /usr/lib. file(INSTALL)
# honours DESTDIR and records every file in the install manifest.
set(gj_prefix "${CMAKE_INSTALL_PREFIX}")
if(gj_prefix STREQUAL "/usr")
  set(SYSCONFDIR "/etc")
else()
  set(SYSCONFDIR "${gj_prefix}/etc")
endif()
set(SBINDIR "${gj_prefix}/${GJ_SBINDIR}")
configure_file("${GJ_SOURCE_DIR}/systemd/gpujobd.service.in"
               "${GJ_BINARY_DIR}/install/gpujobd.service" @ONLY)
file(INSTALL DESTINATION "${gj_prefix}/lib/systemd/system" TYPE FILE
     FILES "${GJ_BINARY_DIR}/install/gpujobd.service")
file(INSTALL DESTINATION "${gj_prefix}/lib/sysusers.d" TYPE FILE RENAME gpujobd.conf
     FILES "${GJ_SOURCE_DIR}/systemd/gpujobd.sysusers")
file(INSTALL DESTINATION "${gj_prefix}/lib/tmpfiles.d" TYPE FILE RENAME gpujobd.conf
     FILES "${GJ_SOURCE_DIR}/systemd/gpujobd.tmpfiles")
# The configuration is the admin's once installed: a reinstall by hand keeps an edited one
# (dpkg handles the package's conffile itself).
if(EXISTS "$ENV{DESTDIR}${SYSCONFDIR}/gpujobd/gpujobd.conf")
  message(STATUS "Kept: $ENV{DESTDIR}${SYSCONFDIR}/gpujobd/gpujobd.conf")
else()
  file(INSTALL DESTINATION "${SYSCONFDIR}/gpujobd" TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE
       GROUP_READ WORLD_READ FILES "${GJ_SOURCE_DIR}/config/gpujobd.conf")
endif()
