# Every dependency is a Debian package installed by scripts/setup; nothing is fetched here.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(yaml-cpp REQUIRED)
# Only the test suites use doctest: a build with TANDEM_BUILD_TESTS=OFF must not need it.
if(TANDEM_BUILD_TESTS)
  find_package(doctest REQUIRED)
endif()
# Boost.Asio and Boost.Beast are header-only: the headers target is all the API needs.
find_package(Boost 1.74 REQUIRED)
