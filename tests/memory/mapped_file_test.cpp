#include "memory/mapped_file.h"

#include <doctest/doctest.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "tests/test_support.h"

using namespace tandem;

namespace {

void write_bytes(const std::filesystem::path& p, const std::string& content) {
  std::ofstream out(p, std::ios::binary);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
}

std::string as_string(const memory::mapped_file& m) { return {reinterpret_cast<const char*>(m.bytes().data()), m.bytes().size()}; }

// The exception message of opening `path`, or "" (and a failed check) when none is thrown.
std::string open_error(const std::string& path) {
  try {
    memory::mapped_file m(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  FAIL_CHECK("opening " << path << " did not throw");
  return "";
}

}  // namespace

TEST_SUITE("mapped_file") {
  TEST_CASE("maps the whole content of a file") {
    test::scratch_dir dir;
    SUBCASE("text") {
      write_bytes(dir / "a.txt", "hello, mapping");
      memory::mapped_file m((dir / "a.txt").string());
      CHECK(m.size() == 14);
      CHECK(m.bytes().size() == 14);
      CHECK(as_string(m) == "hello, mapping");
      CHECK(m.path() == (dir / "a.txt").string());
    }
    SUBCASE("binary content with zero bytes, larger than a page") {
      // Deterministic pattern that includes NULs and every byte value.
      std::string content(3 * 4096 + 123, '\0');
      for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>((i * 7 + i / 256) & 0xff);
      write_bytes(dir / "b.bin", content);
      memory::mapped_file m((dir / "b.bin").string());
      REQUIRE(m.size() == content.size());
      CHECK(as_string(m) == content);
    }
    SUBCASE("a real model file") {
      const auto p = test::data_path("stories260K.gguf");
      memory::mapped_file m(p.string());
      CHECK(m.size() == std::filesystem::file_size(p));
      CHECK(std::memcmp(m.bytes().data(), "GGUF", 4) == 0);
    }
  }

  TEST_CASE("dropped pages read back from the file; ranges outside the mapping are ignored") {
    test::scratch_dir dir;
    std::string content(5 * 4096 + 77, '\0');
    for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>((i * 13 + i / 4096) & 0xff);
    write_bytes(dir / "c.bin", content);
    memory::mapped_file m((dir / "c.bin").string());
    REQUIRE(as_string(m) == content);  // every page resident
    const auto all = m.bytes();
    m.drop_pages(all.subspan(100, 3 * 4096));  // partial first and last pages stay, whole ones go
    m.drop_pages(all);
    m.drop_pages(all.subspan(0, 0));
    m.drop_pages(std::span<const std::byte>(reinterpret_cast<const std::byte*>(content.data()), content.size()));
    CHECK(as_string(m) == content);
    memory::mapped_file empty_source = std::move(m);
    memory::mapped_file moved_from = std::move(empty_source);
    empty_source.drop_pages(all);  // a moved-from mapping has nothing to drop
    CHECK(as_string(moved_from) == content);
  }

  TEST_CASE("an empty file maps to an empty span") {
    test::scratch_dir dir;
    write_bytes(dir / "empty", "");
    memory::mapped_file m((dir / "empty").string());
    CHECK(m.size() == 0);
    CHECK(m.bytes().empty());
    CHECK(m.path() == (dir / "empty").string());
  }

  TEST_CASE("errors name the path") {
    test::scratch_dir dir;
    SUBCASE("missing file") {
      const auto p = (dir / "no-such-file.gguf").string();
      const auto msg = open_error(p);
      CHECK(msg.find(p) != std::string::npos);
      CHECK(msg.find(std::strerror(ENOENT)) != std::string::npos);
    }
    SUBCASE("a directory is refused") {
      const auto p = (dir / "sub").string();
      std::filesystem::create_directory(p);
      const auto msg = open_error(p);
      CHECK(msg.find(p) != std::string::npos);
      CHECK(msg.find("not a regular file") != std::string::npos);
    }
    SUBCASE("a directory's message carries no stale errno text") {
      // fstat succeeded, so there is no system error to report; an errno left over from an
      // earlier failed call must not be appended to the message.
      const auto p = (dir / "sub2").string();
      std::filesystem::create_directory(p);
      errno = ENOENT;
      const auto msg = open_error(p);
      CHECK(msg.find(std::strerror(ENOENT)) == std::string::npos);
    }
  }

  TEST_CASE("move construction and assignment transfer the mapping") {
    test::scratch_dir dir;
    write_bytes(dir / "one", "first file");
    write_bytes(dir / "two", "second");
    SUBCASE("move construction") {
      memory::mapped_file a((dir / "one").string());
      const auto* data = a.bytes().data();
      memory::mapped_file b(std::move(a));
      CHECK(b.bytes().data() == data);
      CHECK(as_string(b) == "first file");
      CHECK(b.path() == (dir / "one").string());
      CHECK(a.size() == 0);  // NOLINT(bugprone-use-after-move): moved-from state is specified
      CHECK(a.bytes().empty());
    }
    SUBCASE("move assignment releases the target's old mapping") {
      memory::mapped_file a((dir / "one").string());
      memory::mapped_file b((dir / "two").string());
      b = std::move(a);
      CHECK(as_string(b) == "first file");
      CHECK(b.path() == (dir / "one").string());
      CHECK(a.bytes().empty());  // NOLINT(bugprone-use-after-move)
    }
    SUBCASE("self move assignment keeps the mapping") {
      memory::mapped_file a((dir / "two").string());
      auto& alias = a;
      a = std::move(alias);
      CHECK(as_string(a) == "second");
    }
    SUBCASE("the mapping outlives the file's directory entry") {
      memory::mapped_file a((dir / "one").string());
      std::filesystem::remove(dir / "one");
      memory::mapped_file b(std::move(a));
      CHECK(as_string(b) == "first file");
    }
  }
}
