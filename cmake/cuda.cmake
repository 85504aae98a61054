# The CUDA backend (included by CMakeLists.txt when a CUDA compiler is found).
# Sets FA_CUDA_SOURCES (the kernels and entry points) and FA_CUDA_LIBS (the static CUDA
# runtime, so C programs that link flashattn_static need nothing else).
#
# Code: sm_90a machine code (Hopper) plus compute_80 PTX that the driver compiles for any
# other GPU at load time. FA_CUDA_ARCHS overrides the list, e.g. "90a" alone to halve the
# build on an H100/H200, or "80;90a".
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

set(FA_CUDA_ARCHS "90a;80-virtual" CACHE STRING "CUDA targets: NN or NNa (machine code), NN-virtual (PTX)")
set(CMAKE_CUDA_ARCHITECTURES OFF)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(FA_CUDA_GENCODE "")
foreach(arch ${FA_CUDA_ARCHS})
  if(arch MATCHES "^([0-9]+a?)-virtual$")
    list(APPEND FA_CUDA_GENCODE "-gencode=arch=compute_${CMAKE_MATCH_1},code=compute_${CMAKE_MATCH_1}")
  else()
    list(APPEND FA_CUDA_GENCODE "-gencode=arch=compute_${arch},code=sm_${arch}")
  endif()
endforeach()

# The directory's warning flags are gcc's; nvcc takes its own. Keep them for C only and
# give CUDA the equivalents (host code through -Xcompiler, device warnings as errors).
get_directory_property(fa_dir_opts COMPILE_OPTIONS)
set(fa_c_opts "")
foreach(opt ${fa_dir_opts})
  list(APPEND fa_c_opts "$<$<COMPILE_LANGUAGE:C>:${opt}>")
endforeach()
set_directory_properties(PROPERTIES COMPILE_OPTIONS "${fa_c_opts}")
add_compile_options(
  "$<$<COMPILE_LANGUAGE:CUDA>:${FA_CUDA_GENCODE}>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-fvisibility=hidden,-fPIC>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-D_POSIX_C_SOURCE=200809L>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-O3>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>")

file(GLOB FA_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/*.cu)
# The Hopper forward (src/cuda/cuda_hopper_fwd_*.cu) has a body only in sm_90a machine code.
if("90a" IN_LIST FA_CUDA_ARCHS)
  file(GLOB fa_hopper_sources ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/cuda_hopper_fwd_*.cu)
  set_source_files_properties(${fa_hopper_sources} PROPERTIES COMPILE_DEFINITIONS FA_CUDA_SM90A)
endif()
set(FA_CUDA_LIBS CUDA::cudart_static)
