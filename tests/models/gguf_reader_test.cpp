#include "models/gguf_reader.h"

#include <doctest/doctest.h>

#include "tests/test_support.h"

using namespace tandem;

TEST_SUITE("gguf_reader") {
  TEST_CASE("reads the stories260K test model") {
    models::gguf_file f(test::data_path("stories260K.gguf").string());
    CHECK(f.version() == 3);
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_int("llama.embedding_length") == 64);
    CHECK(f.get_int("llama.block_count") == 5);
    const auto& emb = f.tensor("token_embd.weight");
    CHECK(emb.ne == std::vector<int64_t>{64, 512});
    CHECK(emb.type == kernels::weight_type::f32);
    CHECK(emb.bytes == 64 * 512 * 4);
    const auto tokens = f.get_strings("tokenizer.ggml.tokens");
    REQUIRE(tokens);
    CHECK(tokens->size() == 512);
    CHECK_THROWS_AS(f.tensor("nope"), models::gguf_error);
    CHECK_THROWS_AS(f.get_int("general.architecture"), models::gguf_error);
  }
}
