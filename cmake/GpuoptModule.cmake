# Functions shared by every module: one static library per layer, one test binary per module, the
# dependency checks that make a missing package fail the configure, and the CLI's command map.

set(GPUOPT_WARNINGS -Wall -Wextra -Wno-unused-parameter)
if(GPUOPT_WERROR)
  list(APPEND GPUOPT_WARNINGS -Werror)
endif()

# Builds without CUDA, by file name, so that no source needs an #if around its whole body:
# X.cu and X_cuda.cpp (host code that calls CUDA but needs no nvcc) are compiled only when
# GPUOPT_CUDA is on; X_unavailable.cpp (the same entry points answering UNIMPLEMENTED) only when it
# is off; every other .cpp always.
function(gpuopt_module_sources out_var dir)
  file(GLOB sources CONFIGURE_DEPENDS ${dir}/*.cpp)
  list(FILTER sources EXCLUDE REGEX "_(cuda|unavailable)\\.cpp$")
  if(GPUOPT_CUDA)
    file(GLOB cuda_sources CONFIGURE_DEPENDS ${dir}/*.cu ${dir}/*_cuda.cpp)
  else()
    file(GLOB cuda_sources CONFIGURE_DEPENDS ${dir}/*_unavailable.cpp)
  endif()
  list(APPEND sources ${cuda_sources})
  set(${out_var} ${sources} PARENT_SCOPE)
endfunction()

# Stops the configure because `module` cannot find `package`; `hint` says where to get it. An
# optional module's message also names the option that builds without it.
function(gpuopt_missing_dependency module package hint)
  string(TOUPPER ${module} upper)
  if(module STREQUAL "cli")
    set(text "gpuopt: the gpuopt CLI needs ${package}, which was not found (${hint}).")
  else()
    set(text "gpuopt: the ${module} module needs ${package}, which was not found (${hint}).")
  endif()
  if(module IN_LIST GPUOPT_OPTIONAL_MODULES)
    string(APPEND text " Install it, or configure with -DGPUOPT_BUILD_${upper}=OFF to build "
                       "gpuopt without the ${module} module.")
  else()
    string(APPEND text " Install it (scripts/setup.sh installs every dependency).")
  endif()
  message(FATAL_ERROR "${text}")
endfunction()

# gpuopt_find_required(MODULE WHAT HINT PACKAGE name [version...]) or
# gpuopt_find_required(MODULE WHAT HINT PKG_CONFIG PREFIX pkg-config-module): find_package, or
# pkg_check_modules with an imported target, failing with a message that names WHAT and HINT (a
# Debian package) rather than CMake's generic one.
macro(gpuopt_find_required module what hint kind)
  if("${kind}" STREQUAL "PACKAGE")
    find_package(${ARGN} QUIET)
    if(NOT ${ARGV4}_FOUND)
      gpuopt_missing_dependency(${module} "${what}" "Debian: ${hint}")
    endif()
  else()
    pkg_check_modules(${ARGV4} QUIET IMPORTED_TARGET ${ARGV5})
    if(NOT ${ARGV4}_FOUND)
      gpuopt_missing_dependency(${module} "${what}" "pkg-config found no module; Debian: ${hint}")
    endif()
  endif()
endmacro()

# gpuopt_module(NAME [DEPS module...] [LIBS target...] [CUDA_LIBS target...])
# Sources: src/NAME/*.cpp and *.cu, chosen as gpuopt_module_sources says. The library is
# gpuopt_NAME in the build tree and gpuopt::NAME for users (the alias here, the installed package).
function(gpuopt_module name)
  cmake_parse_arguments(ARG "" "" "DEPS;LIBS;CUDA_LIBS" ${ARGN})
  string(TOUPPER ${name} upper)
  foreach(dep IN LISTS ARG_DEPS)
    if(NOT TARGET gpuopt_${dep})
      string(TOUPPER ${dep} dep_upper)
      message(FATAL_ERROR "gpuopt: the ${name} module needs the ${dep} module, which is off "
                          "(GPUOPT_BUILD_${dep_upper}=OFF): turn it on, or configure with "
                          "-DGPUOPT_BUILD_${upper}=OFF to build without ${name}.")
    endif()
  endforeach()
  set(imported_libs ${ARG_LIBS})
  if(GPUOPT_CUDA)
    list(APPEND imported_libs ${ARG_CUDA_LIBS})
  endif()
  foreach(lib IN LISTS imported_libs)
    if(lib MATCHES "::" AND NOT TARGET ${lib})
      if(lib MATCHES "^CUDA::(.*)")
        gpuopt_missing_dependency(${name} "${CMAKE_MATCH_1} (${lib})"
          "part of the CUDA toolkit, found at ${CUDAToolkit_LIBRARY_DIR}")
      else()
        gpuopt_missing_dependency(${name} "${lib}" "no such imported target")
      endif()
    endif()
  endforeach()
  gpuopt_module_sources(sources ${CMAKE_CURRENT_SOURCE_DIR})
  if(NOT sources)
    # A module whose first sources are still being written: keep the target so dependents link.
    set(placeholder ${CMAKE_CURRENT_BINARY_DIR}/gpuopt_${name}_empty.cpp)
    file(WRITE ${placeholder} "// ${name} has no sources yet\n")
    set(sources ${placeholder})
  endif()
  add_library(gpuopt_${name} STATIC ${sources})
  add_library(gpuopt::${name} ALIAS gpuopt_${name})
  # gpuopt/version.hpp is generated into ${PROJECT_BINARY_DIR}/include and installed beside the
  # other headers; in the build tree only the CLI and the tests include it.
  target_include_directories(gpuopt_${name}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(gpuopt_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${GPUOPT_WARNINGS}>)
  set_target_properties(gpuopt_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON
                                                  CUDA_SEPARABLE_COMPILATION OFF)
  foreach(dep IN LISTS ARG_DEPS)
    target_link_libraries(gpuopt_${name} PUBLIC gpuopt_${dep})
  endforeach()
  target_link_libraries(gpuopt_${name} PUBLIC ${ARG_LIBS})
  if(GPUOPT_CUDA)
    target_compile_definitions(gpuopt_${name} PUBLIC GPUOPT_CUDA=1)
    target_link_libraries(gpuopt_${name} PUBLIC CUDA::cudart ${ARG_CUDA_LIBS})
    target_compile_options(gpuopt_${name} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  endif()
  set_target_properties(gpuopt_${name} PROPERTIES EXPORT_NAME ${name})
  if(GPUOPT_INSTALL)
    install(TARGETS gpuopt_${name} EXPORT gpuoptTargets
            ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
    if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/include/gpuopt/${name})
      install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/gpuopt/${name}
              DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gpuopt COMPONENT development)
    endif()
  endif()
endfunction()

# The modules each CLI command needs. tools/gpuopt/<command>_*.cpp is compiled, and
# tests/cli/<command>_*.sh run, only when all of them are built; otherwise the CLI keeps the command
# name and says which option left it out. Files whose first word is not a command are always built.
set(GPUOPT_COMMANDS audit bench doctor gemm pipeline trace vector)
set(gpuopt_command_modules_audit report)
set(gpuopt_command_modules_bench bench)
set(gpuopt_command_modules_doctor doctor)
set(gpuopt_command_modules_gemm kernels)
set(gpuopt_command_modules_pipeline pipeline bench)
set(gpuopt_command_modules_trace trace)
set(gpuopt_command_modules_vector vector)

# gpuopt_command_of(FILE OUT_COMMAND): the command a CLI source or CLI test belongs to, or "".
function(gpuopt_command_of file out_command)
  get_filename_component(stem ${file} NAME_WE)
  string(REGEX MATCH "^[a-z0-9]+" first_word ${stem})
  if(first_word IN_LIST GPUOPT_COMMANDS)
    set(${out_command} ${first_word} PARENT_SCOPE)
  else()
    set(${out_command} "" PARENT_SCOPE)
  endif()
endfunction()

# gpuopt_command_missing_modules(COMMAND OUT_LIST): the modules COMMAND needs that are not built.
function(gpuopt_command_missing_modules command out_list)
  set(missing)
  foreach(module IN LISTS gpuopt_command_modules_${command})
    if(NOT module IN_LIST GPUOPT_ENABLED_MODULES)
      list(APPEND missing ${module})
    endif()
  endforeach()
  set(${out_list} ${missing} PARENT_SCOPE)
endfunction()

# gpuopt_test_binary(NAME LABEL cpu|gpu DIR dir LIBS targets...)
# One GoogleTest binary per folder; each TEST becomes a CTest test carrying the label.
function(gpuopt_test_binary name)
  cmake_parse_arguments(ARG "" "LABEL;DIR" "LIBS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${ARG_DIR}/*.cpp)
  if(GPUOPT_CUDA)
    file(GLOB cu_sources CONFIGURE_DEPENDS ${ARG_DIR}/*.cu)
    list(APPEND sources ${cu_sources})
  endif()
  if(NOT sources)
    return()
  endif()
  add_executable(${name} ${sources})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src
                                             ${PROJECT_BINARY_DIR}/include)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    GPUOPT_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
  # Listing the tests loads the binary and its CUDA fatbins; on a loaded 2-core CI machine that
  # took longer than CMake's 5 s default for gpu_kernels.
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 120
    PROPERTIES LABELS ${ARG_LABEL}
    TEST_PREFIX "${ARG_LABEL}.")
endfunction()

# Executables that are not tests or the CLI (benchmark references, helper programs) go to
# ${CMAKE_BINARY_DIR}/bin, which scripts/gpu-build.sh copies to the GPU machine.
function(gpuopt_extra_executable name)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin
                                           LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
endfunction()
