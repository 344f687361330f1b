#include "models/chat_template.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/gguf_reader.h"
#include "tests/test_support.h"

using namespace tandem;
using models::chat_message;
using models::chat_template_kind;

namespace {

// The conversation every family is rendered with: system, user, assistant, user.
const std::vector<chat_message> k_conversation = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
};

std::string render(chat_template_kind k, bool gen = true) { return models::apply_chat_template(k, k_conversation, gen); }

}  // namespace

TEST_SUITE("chat_template") {
  TEST_CASE("names round-trip and unknown names are rejected") {
    for (auto k :
         {chat_template_kind::chatml, chat_template_kind::llama2, chat_template_kind::llama3, chat_template_kind::mistral, chat_template_kind::gemma,
          chat_template_kind::phi3, chat_template_kind::deepseek, chat_template_kind::zephyr, chat_template_kind::plain}) {
      CHECK(models::parse_chat_template_name(models::chat_template_name(k)) == k);
    }
    CHECK(models::chat_template_name(chat_template_kind::llama3) == "llama3");
    CHECK_FALSE(models::parse_chat_template_name("vicuna").has_value());
    CHECK_FALSE(models::parse_chat_template_name("").has_value());
  }

  // Expected strings are what each family's official Jinja template renders (HF settings:
  // trim_blocks, lstrip_blocks) for k_conversation with add_generation_prompt.
  TEST_CASE("each family renders system + user + assistant + user exactly") {
    SUBCASE("chatml") {
      CHECK(render(chat_template_kind::chatml) ==
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\nHi there<|im_end|>\n"
            "<|im_start|>user\nWho are you<|im_end|>\n"
            "<|im_start|>assistant\n");
    }
    SUBCASE("llama2") {
      CHECK(render(chat_template_kind::llama2) ==
            "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]"
            " Hi there </s><s>[INST] Who are you [/INST]");
    }
    SUBCASE("llama3") {
      CHECK(render(chat_template_kind::llama3) ==
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    SUBCASE("mistral") {
      CHECK(render(chat_template_kind::mistral) ==
            "<s> [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s>"
            " [INST] Who are you [/INST]");
    }
    SUBCASE("gemma") {
      CHECK(render(chat_template_kind::gemma) ==
            "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
            "<start_of_turn>model\nHi there<end_of_turn>\n"
            "<start_of_turn>user\nWho are you<end_of_turn>\n"
            "<start_of_turn>model\n");
    }
    SUBCASE("phi3") {
      CHECK(render(chat_template_kind::phi3) ==
            "<|system|>\nYou are a helpful assistant<|end|>\n"
            "<|user|>\nHello<|end|>\n"
            "<|assistant|>\nHi there<|end|>\n"
            "<|user|>\nWho are you<|end|>\n"
            "<|assistant|>\n");
    }
    SUBCASE("deepseek") {
      CHECK(render(chat_template_kind::deepseek) ==
            "<｜begin▁of▁sentence｜>You are a helpful assistant"
            "### Instruction:\nHello\n"
            "### Response:\nHi there\n<|EOT|>\n"
            "### Instruction:\nWho are you\n"
            "### Response:\n");
    }
    SUBCASE("zephyr") {
      CHECK(render(chat_template_kind::zephyr) ==
            "<|system|>\nYou are a helpful assistant</s>\n"
            "<|user|>\nHello</s>\n"
            "<|assistant|>\nHi there</s>\n"
            "<|user|>\nWho are you</s>\n"
            "<|assistant|>\n");
    }
    SUBCASE("plain") {
      CHECK(render(chat_template_kind::plain) ==
            "System: You are a helpful assistant\nUser: Hello\nAssistant: Hi there\n"
            "User: Who are you\nAssistant:");
    }
  }

  TEST_CASE("without a generation prompt") {
    CHECK(render(chat_template_kind::chatml, false).ends_with("Who are you<|im_end|>\n"));
    CHECK(render(chat_template_kind::llama3, false).ends_with("Who are you<|eot_id|>"));
    CHECK(render(chat_template_kind::gemma, false).ends_with("Who are you<end_of_turn>\n"));
    CHECK(render(chat_template_kind::deepseek, false).ends_with("### Instruction:\nWho are you\n"));
    CHECK(render(chat_template_kind::zephyr, false).ends_with("<|user|>\nWho are you</s>\n"));
    CHECK(render(chat_template_kind::plain, false).ends_with("User: Who are you\n"));
    // Phi-3's template closes with EOS; Llama-2 and Mistral end every user turn with the
    // assistant prefix whatever add_generation_prompt says.
    CHECK(render(chat_template_kind::phi3, false).ends_with("Who are you<|end|>\n<|endoftext|>"));
    CHECK(render(chat_template_kind::llama2, false) == render(chat_template_kind::llama2, true));
    CHECK(render(chat_template_kind::mistral, false) == render(chat_template_kind::mistral, true));
  }

  TEST_CASE("content trimming follows each template") {
    const std::vector<chat_message> padded = {{"user", "  hi \n"}, {"assistant", " yo "}};
    CHECK(models::apply_chat_template(chat_template_kind::llama3, padded, false) ==
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>");
    CHECK(models::apply_chat_template(chat_template_kind::llama2, padded, false) == "<s>[INST] hi [/INST] yo </s>");
    CHECK(models::apply_chat_template(chat_template_kind::gemma, padded, false) ==
          "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n");
    // ChatML and Mistral keep content byte for byte.
    CHECK(models::apply_chat_template(chat_template_kind::chatml, padded, false) ==
          "<|im_start|>user\n  hi \n<|im_end|>\n<|im_start|>assistant\n yo <|im_end|>\n");
    CHECK(models::apply_chat_template(chat_template_kind::mistral, padded, false) == "<s> [INST]   hi \n [/INST]  yo </s>");
  }

  TEST_CASE("default system prompts") {
    const std::vector<chat_message> question = {{"user", "Sort a list"}};
    SUBCASE("deepseek injects its own when none is given") {
      const auto out = models::apply_chat_template(chat_template_kind::deepseek, question, true);
      CHECK(out ==
            "<｜begin▁of▁sentence｜>You are an AI programming assistant, utilizing the Deepseek "
            "Coder model, developed by Deepseek Company, and you only answer questions related "
            "to computer science. For politically sensitive questions, security and privacy "
            "issues, and other non-computer science questions, you will refuse to answer\n"
            "### Instruction:\nSort a list\n### Response:\n");
    }
    SUBCASE("a template's default is used only when the first message is not a system one") {
      const models::chat_template t{chat_template_kind::chatml, "Be brief."};
      CHECK(models::apply_chat_template(t, question, true) ==
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSort a list<|im_end|>\n"
            "<|im_start|>assistant\n");
      CHECK(models::apply_chat_template(t, k_conversation, true) == render(chat_template_kind::chatml));
      CHECK(models::apply_chat_template(t, {}, true) == "<|im_start|>assistant\n");
    }
    SUBCASE("other families inject nothing") {
      CHECK(models::apply_chat_template(chat_template_kind::chatml, question, false) == "<|im_start|>user\nSort a list<|im_end|>\n");
      CHECK(models::family_default_system_prompt(chat_template_kind::llama3).empty());
    }
  }

  TEST_CASE("renders_bos matches the rendered text") {
    for (auto k :
         {chat_template_kind::chatml, chat_template_kind::llama2, chat_template_kind::llama3, chat_template_kind::mistral, chat_template_kind::gemma,
          chat_template_kind::phi3, chat_template_kind::deepseek, chat_template_kind::zephyr, chat_template_kind::plain}) {
      CAPTURE(models::chat_template_name(k));
      const auto bos = models::chat_template_bos_text(k);
      CHECK(models::renders_bos(k) == !bos.empty());
      if (models::renders_bos(k)) CHECK(render(k).starts_with(bos));
    }
    CHECK(models::renders_bos(chat_template_kind::llama2));
    CHECK(models::renders_bos(chat_template_kind::llama3));
    CHECK_FALSE(models::renders_bos(chat_template_kind::chatml));
    CHECK_FALSE(models::renders_bos(chat_template_kind::plain));
  }

  TEST_CASE("detects the families by their markers") {
    using k = chat_template_kind;
    CHECK(models::detect_chat_template("") == k::plain);
    CHECK(models::detect_chat_template("{{ messages[0]['content'] }}") == k::plain);
    CHECK(models::detect_chat_template("{{'<|im_start|>' + message['role'] + '\\n'}}") == k::chatml);
    CHECK(models::detect_chat_template("{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>'") == k::llama3);
    CHECK(models::detect_chat_template("{{ '<start_of_turn>' + role + '\\n' }}") == k::gemma);
    CHECK(models::detect_chat_template("{{ bos_token + '[INST] ' }}{{ '<<SYS>>\\n' }}") == k::llama2);
    CHECK(models::detect_chat_template("{{ ' [INST] ' + message['content'] + ' [/INST]' }}") == k::mistral);
    CHECK(models::detect_chat_template("{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}") == k::phi3);
    CHECK(models::detect_chat_template("{{ '<|user|>\\n' + message['content'] + eos_token }}") == k::zephyr);
    CHECK(models::detect_chat_template("{{'### Instruction:\\n' + message['content']}}") == k::deepseek);
    CHECK(models::detect_chat_template("{{ 'User: ' + c }}{{ 'Assistant: ' + c + eos_token }}") == k::deepseek);
    // ChatGLM shares Phi-3's tag but not its format.
    CHECK(models::detect_chat_template("[gMASK]<sop><|user|>\n{{ item['content'] }}") == k::plain);
  }

  TEST_CASE("detects the templates of the vocab test files") {
    // Every tests/data/vocab file that carries a template, with the family it belongs to.
    const std::map<std::string, chat_template_kind> expected = {
        {"ggml-vocab-phi-3.gguf", chat_template_kind::phi3},
        {"ggml-vocab-qwen2.gguf", chat_template_kind::chatml},
        {"ggml-vocab-qwen2.5-coder.gguf", chat_template_kind::chatml},
    };
    int with_template = 0;
    for (const auto& entry : std::filesystem::directory_iterator(test::data_path("vocab"))) {
      if (entry.path().extension() != ".gguf") continue;
      const auto name = entry.path().filename().string();
      CAPTURE(name);
      models::gguf_file f(entry.path().string());
      const auto jinja = f.get_string("tokenizer.chat_template");
      if (!jinja) {
        CHECK(expected.count(name) == 0);
        continue;
      }
      ++with_template;
      REQUIRE(expected.count(name) == 1);
      CHECK(models::detect_chat_template(*jinja) == expected.at(name));
    }
    CHECK(with_template == static_cast<int>(expected.size()));
  }

  TEST_CASE("extracts the default system prompt of ChatML templates") {
    auto from_vocab = [](const std::string& file) {
      models::gguf_file f(test::data_path("vocab/" + file).string());
      return models::chat_template_from_jinja(f.get_string("tokenizer.chat_template").value());
    };
    // Qwen2 writes the prompt with real newlines, Qwen2.5 with "\n" escapes and after a
    // branch that splices in the user's own system message.
    const auto qwen2 = from_vocab("ggml-vocab-qwen2.gguf");
    CHECK(qwen2.kind == chat_template_kind::chatml);
    CHECK(qwen2.default_system == "You are a helpful assistant");
    const auto qwen25 = from_vocab("ggml-vocab-qwen2.5-coder.gguf");
    CHECK(qwen25.default_system == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    const auto phi3 = from_vocab("ggml-vocab-phi-3.gguf");
    CHECK(phi3.kind == chat_template_kind::phi3);
    CHECK(phi3.default_system.empty());
    CHECK(models::chat_template_from_jinja("{{'<|im_start|>' + m + '<|im_end|>'}}").default_system.empty());
  }

  TEST_CASE("renders the SmolLM2 prompt exactly as llama.cpp did") {
    // smollm2-chat.json holds SmolLM2's own template and the prompt llama-cpp-python rendered
    // from it with Jinja (scripts/make-reference).
    const auto ref = nlohmann::json::parse(test::read_file(test::data_path("reference/smollm2-chat.json")));
    const auto t = models::chat_template_from_jinja(ref.at("chat_template").get<std::string>());
    CHECK(t.kind == chat_template_kind::chatml);
    CHECK(t.default_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    std::vector<chat_message> msgs;
    for (const auto& m : ref.at("messages")) {
      msgs.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    CHECK(models::apply_chat_template(t, msgs, ref.at("add_generation_prompt").get<bool>()) == ref.at("prompt").get<std::string>());
  }
}
