// n_indent: lines indented less than the minimum end the completion; whitespace is held
// back until a line shows its indentation.
#include "api/indent_gate.h"

#include <doctest/doctest.h>

using tandem::api::indent_gate;

TEST_SUITE("indent_gate") {
  TEST_CASE("0 passes everything") {
    indent_gate g(0);
    CHECK(g.pass("a\nb\n  c") == "a\nb\n  c");
    CHECK_FALSE(g.closed());
  }

  TEST_CASE("the first line is exempt; deep enough lines and blank lines pass; a shallow one closes") {
    indent_gate g(4);
    std::string out;
    for (const char* piece : {"x = 1", "\n    ", "y = 2\n", "\n", "      z", "\n  ", "w\n", "    never"}) out += g.pass(piece);
    CHECK(out == "x = 1\n    y = 2\n\n      z\n");
    CHECK(g.closed());
  }

  TEST_CASE("whitespace is held until the line's first character, across pieces") {
    indent_gate g(2);
    CHECK(g.pass("a\n") == "a\n");
    CHECK(g.pass(" ") == "");
    CHECK(g.pass("\t") == "");
    CHECK(g.pass("b") == " \tb");  // a tab counts as one character, as in llama.cpp
    CHECK(g.pass("\nc") == "\n");
    CHECK(g.closed());
    CHECK(g.pass("more") == "");
  }
}
