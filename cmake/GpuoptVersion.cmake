# gpuopt/version.hpp (the version and the build settings, for the code and for users of the
# installed package) and, for the CLI, the git revision the binary was built from.

if(GPUOPT_CUDA)
  set(gpuopt_build_info_cuda true)
  set(gpuopt_build_info_cuda_version ${CUDAToolkit_VERSION})
  list(JOIN CMAKE_CUDA_ARCHITECTURES " " gpuopt_build_info_cuda_architectures)
else()
  set(gpuopt_build_info_cuda false)
  set(gpuopt_build_info_cuda_version "")
  set(gpuopt_build_info_cuda_architectures "")
endif()
if(GPUOPT_X86_SIMD)
  set(gpuopt_build_info_x86_simd true)
else()
  set(gpuopt_build_info_x86_simd false)
endif()
list(JOIN GPUOPT_ENABLED_MODULES " " gpuopt_build_info_modules)
configure_file(${CMAKE_CURRENT_LIST_DIR}/version.hpp.in
               ${PROJECT_BINARY_DIR}/include/gpuopt/version.hpp @ONLY)

# The revision is read at build time, not only at configure time, so a rebuild after a commit
# reports the new one. The script rewrites the source only when the revision changed.
find_package(Git QUIET)
set(GPUOPT_GIT_REVISION_SOURCE ${PROJECT_BINARY_DIR}/generated/git_revision.cpp)
set(gpuopt_git_revision_command
    ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DOUTPUT=${GPUOPT_GIT_REVISION_SOURCE}
    -DGIT_EXECUTABLE=${GIT_EXECUTABLE} -P ${CMAKE_CURRENT_LIST_DIR}/GitRevision.cmake)
execute_process(COMMAND ${gpuopt_git_revision_command})
add_custom_target(gpuopt_git_revision COMMAND ${gpuopt_git_revision_command}
                  BYPRODUCTS ${GPUOPT_GIT_REVISION_SOURCE} VERBATIM)
