# Helpers shared by every module: one static library per layer, one test binary per module.

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

# gpuopt_module(NAME [DEPS module...] [LIBS target...] [CUDA_LIBS target...])
# Sources: src/NAME/*.cpp and *.cu, chosen as gpuopt_module_sources says.
function(gpuopt_module name)
  cmake_parse_arguments(ARG "" "" "DEPS;LIBS;CUDA_LIBS" ${ARGN})
  gpuopt_module_sources(sources ${CMAKE_CURRENT_SOURCE_DIR})
  if(NOT sources)
    # A module whose first sources are still being written: keep the target so dependents link.
    set(placeholder ${CMAKE_CURRENT_BINARY_DIR}/gpuopt_${name}_empty.cpp)
    file(WRITE ${placeholder} "// ${name} has no sources yet\n")
    set(sources ${placeholder})
  endif()
  add_library(gpuopt_${name} STATIC ${sources})
  target_include_directories(gpuopt_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include
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
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    GPUOPT_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS ${ARG_LABEL}
    TEST_PREFIX "${ARG_LABEL}.")
endfunction()

# Executables that are not tests or the CLI (benchmark references, helper programs) go to
# ${CMAKE_BINARY_DIR}/bin, which scripts/gpu-build.sh copies to the GPU machine.
function(gpuopt_extra_executable name)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin
                                           LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
endfunction()
