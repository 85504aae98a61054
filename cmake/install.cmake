# What `cmake --install` puts in a prefix for C users: the header, the shared and static
# libraries, a CMake package (find_package(flashattn) -> flashattn::flashattn, and
# flashattn::flashattn_static) and a pkg-config file (flashattn.pc; --static adds what the
# static library needs). Under FA_PYTHON, component "python" puts libflashattn.so in the
# Python package's directory instead (pip install . installs that component alone).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FA_VERSION 0.1.0)
set_target_properties(flashattn PROPERTIES VERSION ${FA_VERSION} SOVERSION 0)
# libflashattn.a beside libflashattn.so
set_target_properties(flashattn_static PROPERTIES OUTPUT_NAME flashattn)
set(FA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashattn)
if(FA_HAVE_CUDA)
  # the archive's CUDA objects are C++: a C program linking it needs the C++ runtime (in
  # this tree the CUDA linker adds it)
  target_link_libraries(flashattn_static INTERFACE "$<INSTALL_INTERFACE:stdc++>")
endif()

install(TARGETS flashattn flashattn_static EXPORT flashattnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(FILES include/flashattn.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
install(EXPORT flashattnTargets NAMESPACE flashattn:: DESTINATION ${FA_CMAKE_DIR} COMPONENT dev)

configure_package_config_file(cmake/flashattnConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flashattnConfig.cmake INSTALL_DESTINATION ${FA_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flashattnConfigVersion.cmake
  VERSION ${FA_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashattnConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/flashattnConfigVersion.cmake
        DESTINATION ${FA_CMAKE_DIR} COMPONENT dev)

# pkg-config: the static library's extra needs (OpenMP, libm, the CUDA runtime) in .private
set(FA_PC_LIBS_PRIVATE "${OpenMP_C_FLAGS} -lm")
if(FA_HAVE_CUDA)
  string(APPEND FA_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt -lpthread -lstdc++")
endif()
# relocatable: the prefix is found from the .pc file's own place, so --prefix works
file(RELATIVE_PATH FA_PC_UP /x/${CMAKE_INSTALL_LIBDIR}/pkgconfig /x)
string(REGEX REPLACE "/$" "" FA_PC_UP "${FA_PC_UP}")
configure_file(cmake/flashattn.pc.in ${CMAKE_CURRENT_BINARY_DIR}/flashattn.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashattn.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# The MPI part, where it was built (CMakeLists.txt: MPI found): its header, libflashattn_mpi.so
# (the core and src/mpi in one library: one copy of the library's state), an export set of
# its own (find_package(flashattn) then finds MPI and imports flashattn::flashattn_mpi) and
# flashattn_mpi.pc (compile with mpicc, which brings MPI's own flags).
if(TARGET flashattn_mpi_shared)
  set_target_properties(flashattn_mpi_shared PROPERTIES VERSION ${FA_VERSION} SOVERSION 0 EXPORT_NAME flashattn_mpi)
  target_include_directories(flashattn_mpi_shared INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  install(TARGETS flashattn_mpi_shared EXPORT flashattnMpiTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  install(FILES include/flashattn_mpi.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
  install(EXPORT flashattnMpiTargets NAMESPACE flashattn:: DESTINATION ${FA_CMAKE_DIR} COMPONENT dev)
  configure_file(cmake/flashattn_mpi.pc.in ${CMAKE_CURRENT_BINARY_DIR}/flashattn_mpi.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashattn_mpi.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endif()

if(FA_PYTHON)
  # what pip builds (pyproject.toml's build.targets): the libraries the package loads, and
  # nothing else (the target "flashattn" would be ambiguous with the CLI's file name)
  add_custom_target(fa_python)
  add_dependencies(fa_python flashattn)
  # modules the package ships beside the library, defined later in the tree (the JAX FFI
  # handler, cmake/jax_ffi.cmake), join it once the whole directory is read
  function(fa_python_module_deps)
    if(TARGET flashattn_jax)
      add_dependencies(fa_python flashattn_jax)
    endif()
  endfunction()
  cmake_language(DEFER CALL fa_python_module_deps)
  # beside python/flashattn/_native.py, which loads it by this name (no SONAME links)
  install(FILES $<TARGET_FILE:flashattn> DESTINATION flashattn RENAME libflashattn.so COMPONENT python)
endif()
