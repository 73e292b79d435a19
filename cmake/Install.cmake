# Installs libsluice with a CMake package config, so a user's project can
#   find_package(sluice CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE sluice::sluice)        # + sluice::redis, sluice::postgres
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The config loader installs as sluice::config (yaml-cpp), the coordinator backends as
# sluice::redis (hiredis) and sluice::postgres (libpq).
set(SLUICE_INSTALLED_TARGETS sluice)
set_target_properties(sluice_config PROPERTIES EXPORT_NAME config)
list(APPEND SLUICE_INSTALLED_TARGETS sluice_config)
foreach(backend redis postgres)
  if(TARGET sluice_${backend})
    set_target_properties(sluice_${backend} PROPERTIES EXPORT_NAME ${backend})
    list(APPEND SLUICE_INSTALLED_TARGETS sluice_${backend})
  endif()
endforeach()

install(TARGETS ${SLUICE_INSTALLED_TARGETS} EXPORT sluiceTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The public headers; each coordinator backend's header is installed with its library.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/sluice DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        PATTERN "redis_coordinator.h" EXCLUDE PATTERN "postgres_coordinator.h" EXCLUDE)
foreach(backend redis postgres)
  if(TARGET sluice_${backend})
    install(FILES ${PROJECT_SOURCE_DIR}/include/sluice/backends/${backend}_coordinator.h
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/sluice/backends)
  endif()
endforeach()
install(EXPORT sluiceTargets NAMESPACE sluice:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/sluiceConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sluiceConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sluiceConfig.cmake ${PROJECT_BINARY_DIR}/sluiceConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)
if(SLUICE_BUILD_APPS)
  install(TARGETS sluice_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
