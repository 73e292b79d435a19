# Every third-party package sluice uses, from Debian 12 (see scripts/deps.sh for the apt names).
find_package(Threads REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)                      # nlohmann_json::nlohmann_json
find_package(prometheus-cpp CONFIG REQUIRED COMPONENTS core)    # prometheus-cpp::core
find_package(PkgConfig REQUIRED)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)      # PkgConfig::HIREDIS (Redis)
find_package(PostgreSQL REQUIRED)                                # PostgreSQL::PostgreSQL (libpq)
pkg_check_modules(MARIADB REQUIRED IMPORTED_TARGET libmariadb)   # PkgConfig::MARIADB (throttler probes)
find_package(yaml-cpp CONFIG REQUIRED)                           # yaml-cpp (the config file)

if(SLUICE_BUILD_APPS)
  find_package(CLI11 CONFIG REQUIRED)                            # CLI11::CLI11
  find_package(fmt CONFIG REQUIRED)                              # fmt::fmt
endif()
if(SLUICE_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)                            # GTest::gtest_main GTest::gmock
  find_package(rapidcheck CONFIG REQUIRED)                       # rapidcheck_gtest
  include(GoogleTest)
endif()
if(SLUICE_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)                        # benchmark::benchmark
endif()

# The server (sluice serve) and its clients: gRPC, protobuf, Boost.Beast.
if(SLUICE_BUILD_APPS)
  find_package(Protobuf REQUIRED)                                # protobuf::libprotobuf, protobuf::protoc
  find_package(gRPC CONFIG REQUIRED)                             # gRPC::grpc++ (+ _reflection, plugins)
  find_package(Boost 1.74 REQUIRED)                              # Boost::headers (Beast, Asio)
  add_library(deps_boost INTERFACE)
  target_link_libraries(deps_boost INTERFACE Boost::headers Threads::Threads)
  # Boost 1.74's asio/awaitable.hpp uses std::exchange without <utility> (GCC 12, C++20).
  target_compile_options(deps_boost INTERFACE "SHELL:-include utility")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_definitions(deps_boost INTERFACE BOOST_ASIO_HAS_CO_AWAIT BOOST_ASIO_HAS_STD_COROUTINE)
  endif()
endif()

# sluice_add_proto(target dir a/b.proto ...): protoc + grpc_cpp_plugin -> a static library of the
# generated code, its headers under <build>/<target>_gen (include as "a/b.pb.h").
function(sluice_add_proto target proto_dir)
  set(gen ${CMAKE_CURRENT_BINARY_DIR}/${target}_gen)
  file(MAKE_DIRECTORY ${gen})
  set(srcs)
  set(files)
  foreach(p ${ARGN})
    get_filename_component(abs ${proto_dir}/${p} ABSOLUTE)
    string(REGEX REPLACE "\\.proto$" "" base ${p})
    list(APPEND files ${abs})
    list(APPEND srcs ${gen}/${base}.pb.cc ${gen}/${base}.grpc.pb.cc)
  endforeach()
  add_custom_command(
    OUTPUT ${srcs}
    COMMAND protobuf::protoc -I ${proto_dir} -I ${Protobuf_INCLUDE_DIRS} --cpp_out=${gen}
            --grpc_out=${gen} --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin> ${files}
    DEPENDS ${files} protobuf::protoc gRPC::grpc_cpp_plugin
    COMMENT "protoc (cpp+grpc) ${ARGN}" VERBATIM)
  add_library(${target} STATIC ${srcs})
  target_include_directories(${target} SYSTEM PUBLIC ${gen})
  target_link_libraries(${target} PUBLIC gRPC::grpc++ protobuf::libprotobuf)
endfunction()
