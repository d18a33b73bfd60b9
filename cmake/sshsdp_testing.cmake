# Test helpers.
#
#   sshsdp_test(NAME name SOURCES a_test.cc LIBS lib...)
#     One single-process GoogleTest binary, one ctest entry.
#
#   sshsdp_mpi_test(NAME name SOURCES a_test.cc LIBS lib... RANKS 1 2 3 4 8 [TIMEOUT s])
#     One GoogleTest binary (linked with sshsdp_mpi_gtest_main, which initialises MPI and
#     makes every rank fail if any rank fails) run as real processes through mpirun, one
#     ctest entry per world size: name_np<N>.
#
#   Either also takes WIDENED (single-process) or WIDENED_RANKS n... (multi-rank): extra
#   ctest entries name_widened / name_np<N>_widened run the same binary with
#   SSHSDP_BF16_GEMM=widened, so a CPU with native bf16 GEMMs (AMX) also tests the path that
#   CPUs without them (AVX2) take. On a CPU without them they repeat the default entries.
#
#   sshsdp_test_variant(name suffix "VAR=value;...")
#     One more ctest entry name_suffix for the single-process binary `name`, with the
#     variables added to its environment.
#
#   SSHSDP_WIDENED_ENV is the environment addition the WIDENED entries use, for ctest entries
#   written by hand (shell tests).
#
# Multi-rank launches oversubscribe the 2 CI cores and run as root, so they pass
# --oversubscribe/--allow-run-as-root, let idle ranks yield (mpi_yield_when_idle) and pin
# compute threads to one per rank.

set(SSHSDP_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
    --mca btl self,vader --mca mpi_yield_when_idle 1)
set(SSHSDP_MPI_ENV "OMP_NUM_THREADS=1;DNNL_MAX_CPU_ISA=ALL;OMPI_MCA_mpi_yield_when_idle=1")
set(SSHSDP_WIDENED_ENV "SSHSDP_BF16_GEMM=widened")

function(sshsdp_test_variant name suffix env)
  add_test(NAME ${name}_${suffix} COMMAND ${name})
  get_test_property(${name} TIMEOUT timeout)
  set_tests_properties(${name}_${suffix} PROPERTIES TIMEOUT ${timeout}
                       ENVIRONMENT "OMP_NUM_THREADS=1;${env}")
endfunction()

function(sshsdp_test)
  cmake_parse_arguments(T "WIDENED" "NAME;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} ENVIRONMENT "OMP_NUM_THREADS=1")
  if(T_WIDENED)
    sshsdp_test_variant(${T_NAME} widened "${SSHSDP_WIDENED_ENV}")
  endif()
endfunction()

function(sshsdp_mpi_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;RANKS;ARGS;WIDENED_RANKS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} sshsdp_mpi_gtest_main GTest::gtest)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  foreach(np ${T_RANKS})
    add_test(NAME ${T_NAME}_np${np}
             COMMAND ${SSHSDP_MPIRUN} -np ${np} $<TARGET_FILE:${T_NAME}> ${T_ARGS})
    set_tests_properties(${T_NAME}_np${np} PROPERTIES TIMEOUT ${T_TIMEOUT}
                         ENVIRONMENT "${SSHSDP_MPI_ENV}" PROCESSORS 2)
  endforeach()
  foreach(np ${T_WIDENED_RANKS})
    add_test(NAME ${T_NAME}_np${np}_widened
             COMMAND ${SSHSDP_MPIRUN} -np ${np} $<TARGET_FILE:${T_NAME}> ${T_ARGS})
    set_tests_properties(${T_NAME}_np${np}_widened PROPERTIES TIMEOUT ${T_TIMEOUT}
                         ENVIRONMENT "${SSHSDP_MPI_ENV};${SSHSDP_WIDENED_ENV}" PROCESSORS 2)
  endforeach()
endfunction()

# A GoogleTest MPI program's GPU case: NAME_cuda_np<n> for each of RANKS, running only FILTER with
# SSHSDP_TEST_BACKEND=cuda (label gpu; reported skipped where there is no GPU or no CUDA).
function(sshsdp_gpu_mpi_test)
  cmake_parse_arguments(T "" "NAME;FILTER" "RANKS" ${ARGN})
  foreach(np ${T_RANKS})
    add_test(NAME ${T_NAME}_cuda_np${np}
             COMMAND ${SSHSDP_MPIRUN} -np ${np} $<TARGET_FILE:${T_NAME}> --gtest_filter=${T_FILTER})
    set_tests_properties(${T_NAME}_cuda_np${np} PROPERTIES TIMEOUT 300 LABELS gpu
                         ENVIRONMENT "${SSHSDP_MPI_ENV};SSHSDP_TEST_BACKEND=cuda"
                         SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]" PROCESSORS ${np})
  endforeach()
endfunction()

# Test tiers (ctest labels), given once every test exists (the top CMakeLists calls it):
#   unit  single-process tests of one layer (GoogleTest binaries)
#   mpi   multi-rank tests: real processes through mpirun (name_np<N>[_widened])
#   e2e   whole-program tests: the sshsdp binary, checkpoints on disk, the examples, the docs
#   slow  over ~10 s on 2 cores (also unit / mpi / e2e); `scripts/test.sh --fast` leaves them out
#   gpu   needs a GPU (reported skipped without one); set where the test is defined
# `ctest -L unit`, `-L mpi`, `-LE 'slow|gpu'` (scripts/test.sh --fast) pick a tier.
set(SSHSDP_SLOW_TESTS
    "^(cli_test|cli_test_widened|cli_fault_test|cli_backend_test|cli_emulated_cuda_test|cli_practitioner_test|cli_bench_test|ckpt_cli_faults|ckpt_cli_resume|readme_test|example_custom_model_subdirectory|backend_emulated_test_forward|backend_emulated_test_reverse)$")
set(SSHSDP_E2E_TESTS "^(cli_|ckpt_cli_|readme_|example_|comm_failure_|layering_)")
# Labels every test of the current directory (set_tests_properties reaches no other).
function(sshsdp_label_tests)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t ${tests})
    get_test_property(${t} LABELS labels)
    if(NOT labels)
      set(labels "")
    endif()
    if("gpu" IN_LIST labels)
      continue()
    endif()
    if(t MATCHES "${SSHSDP_E2E_TESTS}")
      list(APPEND labels e2e)
    elseif(t MATCHES "_np[0-9]+(_[a-z]+)?$")
      list(APPEND labels mpi)
    else()
      list(APPEND labels unit)
    endif()
    if(t MATCHES "${SSHSDP_SLOW_TESTS}")
      list(APPEND labels slow)
    endif()
    set_tests_properties(${t} PROPERTIES LABELS "${labels}")
  endforeach()
endfunction()

# Labels the current directory's tests once it is processed (a test directory's CMakeLists
# calls it where its tests begin).
macro(sshsdp_label_tests_at_end)
  cmake_language(DEFER CALL sshsdp_label_tests)
endmacro()
