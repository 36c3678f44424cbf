# GPU suites: every tests/gpu/test_*.cpp is its own executable, labelled `gpu`.
# They list fine without a GPU and skip cleanly at run time when none is visible.
file(GLOB FLASHATTN_GPU_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/test_*.cpp)
foreach(src ${FLASHATTN_GPU_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  # A suite may carry device code in <name>_kernels.cu beside it.
  if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/${name}_kernels.cu)
    target_sources(${name} PRIVATE ${CMAKE_CURRENT_LIST_DIR}/${name}_kernels.cu)
  endif()
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(${name} PRIVATE flashattn_testing CUDA::cudart GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS gpu TIMEOUT 900)
endforeach()

# The NCCL ring suite runs the transport's source with NCCL when CMake found it
# (FLASHATTN_NCCL_LIBRARY, top-level CMakeLists.txt); otherwise it skips.
if(TARGET test_ring_nccl AND FLASHATTN_NCCL_LIBRARY)
  target_sources(test_ring_nccl PRIVATE ${PROJECT_SOURCE_DIR}/src/ring/nccl_transport.cpp)
  target_include_directories(test_ring_nccl PRIVATE ${FLASHATTN_NCCL_INCLUDE_DIR})
  target_link_libraries(test_ring_nccl PRIVATE ${FLASHATTN_NCCL_LIBRARY})
  target_compile_definitions(test_ring_nccl PRIVATE FLASHATTN_TEST_NCCL=1)
endif()
