# Every third-party package sluice uses, from Debian 12 (see scripts/deps.sh for the apt names).
find_package(Threads REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)                      # nlohmann_json::nlohmann_json
find_package(prometheus-cpp CONFIG REQUIRED COMPONENTS core)    # prometheus-cpp::core
find_package(PkgConfig REQUIRED)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)      # PkgConfig::HIREDIS (Redis)
find_package(PostgreSQL REQUIRED)                                # PostgreSQL::PostgreSQL (libpq)
pkg_check_modules(MARIADB REQUIRED IMPORTED_TARGET libmariadb)   # PkgConfig::MARIADB (throttler probes)
find_package(yaml-cpp CONFIG REQUIRED)                           # yaml-cpp (the config file)
# The generated API's messages (the engine's kinds read theirs with them).
find_package(Protobuf REQUIRED)                                  # protobuf::libprotobuf, protobuf::protoc
# gRPC: the server's API, and the etcd coordinators' client (so every build has it).
find_package(gRPC CONFIG REQUIRED)                               # gRPC::grpc++ (+ _reflection, plugins)

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

# The server (sluice serve) and its clients: Boost.Beast (and gRPC, above).
if(SLUICE_BUILD_APPS)
  find_package(Boost 1.74 REQUIRED)                              # Boost::headers (Beast, Asio)
  add_library(deps_boost INTERFACE)
  target_link_libraries(deps_boost INTERFACE Boost::headers Threads::Threads)
  # Boost 1.74's asio/awaitable.hpp uses std::exchange without <utility> (GCC 12, C++20).
  target_compile_options(deps_boost INTERFACE "SHELL:-include utility")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_definitions(deps_boost INTERFACE BOOST_ASIO_HAS_CO_AWAIT BOOST_ASIO_HAS_STD_COROUTINE)
  endif()
endif()

# sluice_proto_outputs(srcs files gen suffix dir a/b.proto ...): sets `files` to the .proto
# files' absolute paths and `srcs` to what protoc writes for them in `gen` (a/b<suffix>).
function(sluice_proto_outputs srcs_var files_var gen suffix proto_dir)
  set(srcs)
  set(files)
  foreach(p ${ARGN})
    get_filename_component(abs ${proto_dir}/${p} ABSOLUTE)
    string(REGEX REPLACE "\\.proto$" "" base ${p})
    list(APPEND files ${abs})
    list(APPEND srcs ${gen}/${base}${suffix})
  endforeach()
  set(${srcs_var} ${srcs} PARENT_SCOPE)
  set(${files_var} ${files} PARENT_SCOPE)
endfunction()

# sluice_add_proto_messages(target dir a/b.proto ...): protoc -> a static library of the
# generated messages (no gRPC), its headers under <build>/<target>_gen (include as "a/b.pb.h").
function(sluice_add_proto_messages target proto_dir)
  set(gen ${CMAKE_CURRENT_BINARY_DIR}/${target}_gen)
  file(MAKE_DIRECTORY ${gen})
  sluice_proto_outputs(srcs files ${gen} .pb.cc ${proto_dir} ${ARGN})
  add_custom_command(
    OUTPUT ${srcs}
    COMMAND protobuf::protoc -I ${proto_dir} -I ${Protobuf_INCLUDE_DIRS} --cpp_out=${gen} ${files}
    DEPENDS ${files} protobuf::protoc
    COMMENT "protoc (cpp) ${ARGN}" VERBATIM)
  add_library(${target} STATIC ${srcs})
  target_include_directories(${target} SYSTEM PUBLIC ${gen})
  target_link_libraries(${target} PUBLIC protobuf::libprotobuf)
endfunction()

# sluice_add_grpc(target messages dir a/b.proto ...): grpc_cpp_plugin -> a static library of the
# gRPC stubs over the messages library `messages` (made by sluice_add_proto_messages from the
# same files), its headers under <build>/<target>_gen (include as "a/b.grpc.pb.h").
function(sluice_add_grpc target messages proto_dir)
  set(gen ${CMAKE_CURRENT_BINARY_DIR}/${target}_gen)
  file(MAKE_DIRECTORY ${gen})
  sluice_proto_outputs(srcs files ${gen} .grpc.pb.cc ${proto_dir} ${ARGN})
  add_custom_command(
    OUTPUT ${srcs}
    COMMAND protobuf::protoc -I ${proto_dir} -I ${Protobuf_INCLUDE_DIRS} --grpc_out=${gen}
            --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin> ${files}
    DEPENDS ${files} protobuf::protoc gRPC::grpc_cpp_plugin
    COMMENT "protoc (grpc) ${ARGN}" VERBATIM)
  add_library(${target} STATIC ${srcs})
  target_include_directories(${target} SYSTEM PUBLIC ${gen})
  target_link_libraries(${target} PUBLIC ${messages} gRPC::grpc++)
endfunction()

# sluice_add_proto(target dir a/b.proto ...): both: the messages (${target}_messages) and the gRPC
# stubs over them (${target}).
function(sluice_add_proto target proto_dir)
  sluice_add_proto_messages(${target}_messages ${proto_dir} ${ARGN})
  sluice_add_grpc(${target} ${target}_messages ${proto_dir} ${ARGN})
endfunction()
