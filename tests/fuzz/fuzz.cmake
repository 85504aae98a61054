# The fuzz harnesses (tests/fuzz/fuzz_<name>.c, each an LLVMFuzzerTestOneInput):
#  - always: fuzz_replay_<name>, the harness with a plain main() (replay_main.c), and a ctest
#    that runs every seed-corpus and regression input through it (make test);
#  - with FA_FUZZ=ON (clang; tests/fuzz/run.sh, i.e. make fuzz): fuzz_<name>, the libFuzzer
#    binary. The library itself then carries -fsanitize=fuzzer-no-link (set at the top of
#    CMakeLists.txt) so coverage guides the search into its code too.
set(FA_FUZZ_DIR ${CMAKE_CURRENT_SOURCE_DIR}/tests/fuzz)
set(FA_FUZZ_HARNESSES npy cli_args plan forward)
set(FA_FUZZ_EXTRA_npy tools/npy.c)
set(FA_FUZZ_EXTRA_cli_args tools/cli_args.c)
set(FA_FUZZ_EXTRA_plan "")
set(FA_FUZZ_EXTRA_forward "")

foreach(h ${FA_FUZZ_HARNESSES})
  set(srcs ${FA_FUZZ_DIR}/fuzz_${h}.c)
  foreach(x ${FA_FUZZ_EXTRA_${h}})
    list(APPEND srcs ${CMAKE_CURRENT_SOURCE_DIR}/${x})
  endforeach()
  set(targets fuzz_replay_${h})
  add_executable(fuzz_replay_${h} ${srcs} ${FA_FUZZ_DIR}/replay_main.c)
  add_test(NAME test_fuzz_replay_${h}
           COMMAND fuzz_replay_${h} ${FA_FUZZ_DIR}/corpus/${h} ${FA_FUZZ_DIR}/regressions/${h})
  set_tests_properties(test_fuzz_replay_${h} PROPERTIES TIMEOUT 300)
  if(FA_FUZZ)
    add_executable(fuzz_${h} EXCLUDE_FROM_ALL ${srcs})
    target_link_options(fuzz_${h} PRIVATE -fsanitize=fuzzer)
    list(APPEND targets fuzz_${h})
  endif()
  foreach(t ${targets})
    target_include_directories(${t} PRIVATE include src tests tests/fuzz tools)
    target_link_libraries(${t} PRIVATE fa_ref flashattn_static m)
  endforeach()
endforeach()
