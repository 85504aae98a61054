# Allocation-failure tests, only in a build with FA_ALLOC_FAILURE_INJECTION (tests/run_all.sh's
# ASan build): the library (test_alloc_failure; test_alloc_failure_varlen for a packed
# cu_seqlens plan; test_alloc_failure_decode for a kv-cache decode plan; test_alloc_workspace: a
# caller's workspace of workspace_bytes, no allocation) and the CLI's run and grad, dense and packed (test_cli_alloc_failure.sh),
# the n-th allocation failing for every n reached.
if(FA_ALLOC_FAILURE_INJECTION)
  add_executable(test_alloc_failure ${CMAKE_CURRENT_SOURCE_DIR}/tests/alloc/test_alloc_failure.c)
  target_include_directories(test_alloc_failure PRIVATE include src tests)
  target_link_libraries(test_alloc_failure PRIVATE fa_ref flashattn_static m)
  add_test(NAME test_alloc_failure COMMAND test_alloc_failure)
  add_executable(test_alloc_failure_varlen ${CMAKE_CURRENT_SOURCE_DIR}/tests/alloc/test_alloc_failure_varlen.c)
  target_include_directories(test_alloc_failure_varlen PRIVATE include src tests)
  target_link_libraries(test_alloc_failure_varlen PRIVATE fa_ref flashattn_static m)
  add_test(NAME test_alloc_failure_varlen COMMAND test_alloc_failure_varlen)
  add_executable(test_alloc_failure_decode ${CMAKE_CURRENT_SOURCE_DIR}/tests/alloc/test_alloc_failure_decode.c)
  target_include_directories(test_alloc_failure_decode PRIVATE include src tests)
  target_link_libraries(test_alloc_failure_decode PRIVATE fa_ref flashattn_static m)
  add_test(NAME test_alloc_failure_decode COMMAND test_alloc_failure_decode)
  add_executable(test_alloc_workspace ${CMAKE_CURRENT_SOURCE_DIR}/tests/alloc/test_alloc_workspace.c)
  target_include_directories(test_alloc_workspace PRIVATE include src tests)
  target_link_libraries(test_alloc_workspace PRIVATE flashattn_static m)
  add_test(NAME test_alloc_workspace COMMAND test_alloc_workspace)
  add_test(NAME test_cli_alloc_failure
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/alloc/test_cli_alloc_failure.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(test_alloc_failure test_alloc_failure_varlen test_alloc_failure_decode test_cli_alloc_failure
                       PROPERTIES TIMEOUT 600)
endif()
