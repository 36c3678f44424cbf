# The two ways a project consumes flashattn, each building and running examples/:
#   - install into a scratch prefix, then find_package(flashattn);
#   - add_subdirectory of the source tree (CPU only, to keep it quick).
set(root ${BINARY_DIR}/install-test)
set(prefix ${root}/prefix)
file(REMOVE_RECURSE ${root})

# Configures `source` into `build` with the given cache arguments, builds it, and
# runs the example, which must end by reporting the bad-input error it provokes.
function(build_and_run_consumer what source build)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${source} -B ${build} -G Ninja ${ARGN}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "configuring the ${what} consumer failed")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${build} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building the ${what} consumer failed")
  endif()
  execute_process(COMMAND ${build}/forward_backward RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message("${what}: ${out}")
  if(rc OR NOT out MATCHES "as expected: invalid argument: heads_q")
    message(FATAL_ERROR "the ${what} example failed (${rc})")
  endif()
endfunction()

execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed")
endif()
build_and_run_consumer("find_package" ${SOURCE_DIR}/examples ${root}/consumer
                       -DCMAKE_PREFIX_PATH=${prefix})
build_and_run_consumer("add_subdirectory" ${SOURCE_DIR}/tests/subdirectory_consumer ${root}/subdirectory
                       -DFLASHATTN_SOURCE_DIR=${SOURCE_DIR} -DFLASHATTN_CUDA=OFF)
