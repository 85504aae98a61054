# The XLA FFI handler behind flashattn.jax (python/csrc/jax_ffi*.c): a small module built
# against the FFI C API headers that jaxlib ships, linked to the flashattn shared library
# that sits beside it in the Python package. Skipped, with a note, where no Python with
# jaxlib is found: the rest of the package (numpy, torch fronts) does not need it.
if(NOT FA_JAX_FFI_INCLUDE_DIR)
  find_package(Python COMPONENTS Interpreter QUIET)
  if(Python_EXECUTABLE)
    # jaxlib's own folder, as jax.ffi.include_dir() returns, without importing jax
    execute_process(
      COMMAND ${Python_EXECUTABLE} -c
              "import importlib.util as u, os; s = u.find_spec('jaxlib'); print(os.path.join(os.path.dirname(s.origin), 'include') if s else '')"
      OUTPUT_VARIABLE FA_JAX_FFI_FOUND_DIR OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  set(FA_JAX_FFI_INCLUDE_DIR "${FA_JAX_FFI_FOUND_DIR}" CACHE PATH "jaxlib's include folder (xla/ffi/api/c_api.h)")
endif()

if(NOT EXISTS "${FA_JAX_FFI_INCLUDE_DIR}/xla/ffi/api/c_api.h")
  message(STATUS "flashattn: jaxlib's FFI headers not found (Python: ${Python_EXECUTABLE}); "
                 "building without flashattn.jax")
  return()
endif()
# jaxlib 0.4's headers are not C (struct tags without typedefs), and a header of another
# major FFI API version may lay the structs out differently (python/csrc/jax_ffi_frame.h
# stops such a build): skipped with a note, as with no headers, not a failed build
include(CheckCSourceCompiles)
set(CMAKE_REQUIRED_INCLUDES "${FA_JAX_FFI_INCLUDE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}/include"
                            "${CMAKE_CURRENT_SOURCE_DIR}/python/csrc")
unset(FA_JAX_FFI_HEADERS_OK CACHE)  # judged again for whichever headers this configure found
check_c_source_compiles("#include \"jax_ffi_frame.h\"\nint main(void) { return FJ_FFI_API_MINOR; }"
                        FA_JAX_FFI_HEADERS_OK)
unset(CMAKE_REQUIRED_INCLUDES)
if(NOT FA_JAX_FFI_HEADERS_OK)
  message(STATUS "flashattn: jaxlib's FFI headers in ${FA_JAX_FFI_INCLUDE_DIR} do not build the "
                 "handler (jaxlib 0.5 or newer needed); building without flashattn.jax")
  return()
endif()
message(STATUS "flashattn: JAX FFI handler against ${FA_JAX_FFI_INCLUDE_DIR}")

add_library(flashattn_jax MODULE python/csrc/jax_ffi.c python/csrc/jax_ffi_frame.c python/csrc/jax_ffi_inference.c)
# SYSTEM: the headers' style (C++ comments, typedef repeats) is theirs, not ours to warn on
target_include_directories(flashattn_jax SYSTEM PRIVATE "${FA_JAX_FFI_INCLUDE_DIR}")
target_include_directories(flashattn_jax PRIVATE include python/csrc)
target_link_libraries(flashattn_jax PRIVATE flashattn)
set_target_properties(flashattn_jax PROPERTIES
  PREFIX "lib" C_VISIBILITY_PRESET hidden
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
  INSTALL_RPATH "$ORIGIN")
# Beside libflashattn.so in the package. Its NEEDED entry is the library's SONAME
# (libflashattn.so.0); flashattn.jax imports flashattn first, which loads the library, and
# the dynamic loader matches an already loaded library by SONAME.
if(FA_PYTHON)
  install(TARGETS flashattn_jax LIBRARY DESTINATION flashattn COMPONENT python)
endif()
