# Install rules and the CMake package: cmake --install puts the gpuopt program in bin/, the module
# libraries in lib/, the headers in include/gpuopt/ and gpuoptConfig.cmake (with its version file
# and exported targets) in lib/cmake/gpuopt/. tests/install is a project that uses them.
include(CMakePackageConfigHelpers)

set(GPUOPT_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/gpuopt)
install(FILES ${PROJECT_BINARY_DIR}/include/gpuopt/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gpuopt COMPONENT development)
# `gpuopt trace` looks for its injection library beside the program and in ../lib.
if(TARGET gpuopt_trace_inject)
  install(TARGETS gpuopt_trace_inject LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          COMPONENT runtime)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/CHANGELOG.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)

install(EXPORT gpuoptTargets NAMESPACE gpuopt:: DESTINATION ${GPUOPT_PACKAGE_DIR}
        COMPONENT development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/gpuoptConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/package/gpuoptConfig.cmake
                              INSTALL_DESTINATION ${GPUOPT_PACKAGE_DIR})
# Before 1.0 a minor version may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/gpuoptConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/gpuoptConfig.cmake
              ${PROJECT_BINARY_DIR}/package/gpuoptConfigVersion.cmake
        DESTINATION ${GPUOPT_PACKAGE_DIR} COMPONENT development)
