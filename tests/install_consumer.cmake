# The ways a project consumes flashattn, each building and running examples/:
#   - install into a scratch prefix, then find_package(flashattn);
#   - the same install through pkg-config (a plain compiler command line);
#   - add_subdirectory of the source tree (CPU only, to keep it quick).
# It also checks the installed library's versioning (SONAME, symlinks) and the
# installed CLI's --version.
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
  run_example(${what} ${build}/forward_backward)
endfunction()

# Runs the example built at `exe` and checks it ends with the error it provokes.
function(run_example what exe)
  execute_process(COMMAND ${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message("${what}: ${out}")
  if(rc OR NOT out MATCHES "as expected: invalid argument: heads_q")
    message(FATAL_ERROR "the ${what} example failed (${rc})")
  endif()
endfunction()

# libflashattn.so -> libflashattn.so.<major> -> libflashattn.so.<version>, and
# the SONAME recorded in the file is the major's name (what the loader looks for).
function(check_versioned_library)
  string(REGEX MATCH "^[0-9]+" major "${VERSION}")
  set(lib ${prefix}/${LIBDIR}/libflashattn.so)
  foreach(link ${lib} ${lib}.${major})
    if(NOT IS_SYMLINK ${link})
      message(FATAL_ERROR "${link} is not a symlink")
    endif()
  endforeach()
  if(IS_SYMLINK ${lib}.${VERSION} OR NOT EXISTS ${lib}.${VERSION})
    message(FATAL_ERROR "${lib}.${VERSION} is not the library file")
  endif()
  find_program(readelf readelf REQUIRED)
  execute_process(COMMAND ${readelf} -d ${lib}.${VERSION} OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  if(rc OR NOT dyn MATCHES "\\(SONAME\\)[^\n]*\\[libflashattn\\.so\\.${major}\\]")
    message(FATAL_ERROR "SONAME of ${lib}.${VERSION} is not libflashattn.so.${major}:\n${dyn}")
  endif()
  message("SONAME libflashattn.so.${major}, symlinks in place")
endfunction()

# pkg-config finds the install and reports its version, and its flags alone build
# and link the example (no RPATH: the loader is pointed at the prefix's libdir).
function(check_pkg_config_consumer)
  find_program(pkg_config NAMES pkg-config pkgconf REQUIRED)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/${LIBDIR}/pkgconfig)
  execute_process(COMMAND ${pkg_config} --modversion flashattn OUTPUT_VARIABLE version
                  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(rc OR NOT version STREQUAL VERSION)
    message(FATAL_ERROR "pkg-config --modversion flashattn gave '${version}', not ${VERSION}")
  endif()
  execute_process(COMMAND ${pkg_config} --cflags --libs flashattn OUTPUT_VARIABLE flags
                  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(exe ${root}/pkg-config/forward_backward)
  file(MAKE_DIRECTORY ${root}/pkg-config)
  execute_process(COMMAND ${CXX} -std=c++17 ${SOURCE_DIR}/examples/forward_backward.cpp ${flags} -o ${exe}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building the example with pkg-config's flags (${flags}) failed")
  endif()
  set(ENV{LD_LIBRARY_PATH} ${prefix}/${LIBDIR})
  run_example("pkg-config" ${exe})
  unset(ENV{LD_LIBRARY_PATH})
endfunction()

# The installed header's FA_VERSION_* macros spell the project's version (one
# release number everywhere: CMake, header, fa_version(), pkg-config, the wheel).
function(check_header_version)
  file(STRINGS ${prefix}/include/flashattn/flashattn.h lines REGEX "^#define FA_VERSION_(MAJOR|MINOR|PATCH) ")
  set(parts "")
  foreach(line ${lines})
    string(REGEX REPLACE "^#define FA_VERSION_[A-Z]+ ([0-9]+).*" "\\1" number "${line}")
    list(APPEND parts ${number})
  endforeach()
  list(JOIN parts "." header_version)
  if(NOT header_version STREQUAL VERSION)
    message(FATAL_ERROR "flashattn.h says version ${header_version}, the project ${VERSION}")
  endif()
endfunction()

function(check_cli_version)
  if(NOT WITH_TOOLS)
    return()
  endif()
  execute_process(COMMAND ${prefix}/bin/flashattn --version OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(rc OR NOT out MATCHES "^flashattn ${VERSION} \\(commit ")
    message(FATAL_ERROR "flashattn --version printed '${out}' (${rc})")
  endif()
  message("installed CLI: ${out}")
endfunction()

execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed")
endif()
build_and_run_consumer("find_package" ${SOURCE_DIR}/examples ${root}/consumer
                       -DCMAKE_PREFIX_PATH=${prefix})
check_versioned_library()
check_header_version()
check_pkg_config_consumer()
check_cli_version()
build_and_run_consumer("add_subdirectory" ${SOURCE_DIR}/tests/subdirectory_consumer ${root}/subdirectory
                       -DFLASHATTN_SOURCE_DIR=${SOURCE_DIR} -DFLASHATTN_CUDA=OFF)
