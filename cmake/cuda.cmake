# CUDA backend of mlx_fp4 (csrc/cuda/), built only when the MLX that CMake found is a CUDA build.
#
# Contract with the top-level CMakeLists.txt:
#   include(cmake/cuda.cmake)
#       At file scope, after find_package(MLX). When MLX is a CUDA build this enables the CUDA
#       language (enable_language must run at file scope, not inside a function); otherwise it does
#       nothing, so a CPU-only build never needs nvcc.
#   mlx_fp4_is_cuda_build(OUT_VAR)
#       Sets OUT_VAR to TRUE when the imported `mlx` target is a CUDA build, else FALSE. MLXConfig.cmake
#       has no MLX_BUILD_CUDA; the CUDA wheel's imported target lists CUDA::cuda_driver among its link
#       dependencies (IMPORTED_LINK_DEPENDENT_LIBRARIES_<CONFIG>), the CPU wheel lists nothing.
#   mlx_fp4_add_cuda_backend(TARGET)
#       Adds the kernels (csrc/cuda/*.cu, compiled by nvcc into an object library) and the MLX glue
#       (csrc/cuda/*.cpp, compiled by the C++ compiler) to TARGET, and links the static CUDA runtime
#       and cuBLASLt (the driver API is only reached through libmlx).
#
# Cache options:
#   MLX_FP4_CUDA_ARCHS   CUDA_ARCHITECTURES of the kernels (default: sm_80, 86, 89, 90 cubins and
#                        compute_90 PTX for newer GPUs). A faster developer build: -DMLX_FP4_CUDA_ARCHS=90-real
#
# Build requirements: nvcc of the CUDA major version of the mlx-cuda wheel (13 for mlx[cuda13]) and,
# for MLXConfig.cmake's find_dependency(CUDNN), -DCUDNN_INCLUDE_PATH / -DCUDNN_LIBRARY_PATH when cuDNN
# is not in a system folder (pip's nvidia-cudnn-cu13 puts it under site-packages/nvidia/cudnn).

set(MLX_FP4_CUDA_ARCHS "80-real;86-real;89-real;90-real;90-virtual"
    CACHE STRING "CUDA architectures of the mlx_fp4 kernels")

function(mlx_fp4_is_cuda_build OUT_VAR)
  set(_is_cuda FALSE)
  if(TARGET mlx)
    set(_props INTERFACE_LINK_LIBRARIES IMPORTED_LINK_DEPENDENT_LIBRARIES IMPORTED_LINK_INTERFACE_LIBRARIES)
    get_target_property(_configs mlx IMPORTED_CONFIGURATIONS)
    if(_configs)
      foreach(_cfg IN LISTS _configs)
        string(TOUPPER "${_cfg}" _cfg)
        list(APPEND _props IMPORTED_LINK_DEPENDENT_LIBRARIES_${_cfg} IMPORTED_LINK_INTERFACE_LIBRARIES_${_cfg})
      endforeach()
    endif()
    foreach(_prop IN LISTS _props)
      get_target_property(_deps mlx ${_prop})
      if(_deps AND "${_deps}" MATCHES "CUDA::cuda_driver")
        set(_is_cuda TRUE)
      endif()
    endforeach()
  endif()
  set(${OUT_VAR} ${_is_cuda} PARENT_SCOPE)
endfunction()

mlx_fp4_is_cuda_build(_mlx_fp4_cuda_detected)
if(_mlx_fp4_cuda_detected)
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND CMAKE_CXX_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "${MLX_FP4_CUDA_ARCHS}")
  endif()
  enable_language(CUDA)
  # MLXConfig.cmake already ran find_dependency(CUDAToolkit); this is a no-op then.
  find_package(CUDAToolkit REQUIRED)
endif()

function(mlx_fp4_add_cuda_backend TARGET)
  set(_src "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../csrc")
  get_filename_component(_src "${_src}" ABSOLUTE)

  # Kernels: framework-free .cu (no MLX header: nvcc rejects the fmt code MLX's CUDA headers pull in).
  add_library(mlx_fp4_cuda_kernels OBJECT "${_src}/cuda/w4a16_matmul.cu" "${_src}/cuda/gather_w4a16_matmul.cu")
  set_target_properties(mlx_fp4_cuda_kernels PROPERTIES
    CUDA_ARCHITECTURES "${MLX_FP4_CUDA_ARCHS}"
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON
    POSITION_INDEPENDENT_CODE ON
    CUDA_SEPARABLE_COMPILATION OFF)
  target_include_directories(mlx_fp4_cuda_kernels PRIVATE "${_src}")
  # --threads 0: one nvcc thread per architecture.
  target_compile_options(mlx_fp4_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--threads=0 -Xptxas=-warn-spills>)

  # MLX glue (C++ compiler, MLX's CUDA headers, our fmt stand-in) and the cuBLASLt step.
  set(_glue "${_src}/cuda/w4a16_matmul.cpp" "${_src}/cuda/w4a16_cublas.cpp" "${_src}/cuda/mlx_memory.cpp"
    "${_src}/cuda/gather_w4a16_matmul.cpp")
  target_sources(${TARGET} PRIVATE $<TARGET_OBJECTS:mlx_fp4_cuda_kernels> ${_glue})
  set_source_files_properties(${_glue} TARGET_DIRECTORY ${TARGET} PROPERTIES
    INCLUDE_DIRECTORIES "${_src}/cuda/fmt_shim;${CUDAToolkit_INCLUDE_DIRS}"
    COMPILE_DEFINITIONS "MLX_FP4_CUDA=1")
  # The static runtime (as libmlx): no libcudart.so needed at run time. cuBLASLt has the same SONAME
  # (libcublasLt.so.13) that libmlx already loads from the nvidia-cublas wheel; when the toolkit has
  # no cuBLASLt, link that wheel's copy.
  set(_lt CUDA::cublasLt)
  if(NOT TARGET CUDA::cublasLt)
    execute_process(COMMAND "${Python_EXECUTABLE}" -c "import nvidia; print(list(nvidia.__path__)[0])"
                    OUTPUT_VARIABLE _nv OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    find_library(MLX_FP4_CUBLASLT NAMES cublasLt libcublasLt.so.13
                 HINTS "${_nv}/cu13/lib" "${_nv}/cublas/lib" REQUIRED)
    find_path(MLX_FP4_CUBLASLT_INCLUDE cublasLt.h HINTS "${_nv}/cu13/include" "${_nv}/cublas/include" REQUIRED)
    set(_lt "${MLX_FP4_CUBLASLT}")
    set_property(SOURCE ${_glue} TARGET_DIRECTORY ${TARGET} APPEND PROPERTY INCLUDE_DIRECTORIES
                 "${MLX_FP4_CUBLASLT_INCLUDE}")
  endif()
  target_link_libraries(${TARGET} PRIVATE CUDA::cudart_static ${_lt} ${CMAKE_DL_LIBS})
endfunction()
