// Tokenizer against HF `tokenizers`: the ids it gave for every held-out document
// (testdata/heldout.jsonl, scripts/make_tokenizer_golden.py) for a GPT-2-style and a
// Qwen-style tokenizer, exactly, and an exact round trip; the batch encoder equals the serial
// one; unsupported tokenizer.json contents and invalid UTF-8 are refused by name.
#include "sshsdp/text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

std::string Read(const std::string& name) {
  std::ifstream in(std::string(SSHSDP_TEXT_TESTDATA) + "/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Golden {
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
};

Golden Load(const std::string& kind) {
  Golden g;
  std::istringstream lines(Read("heldout.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    g.texts.push_back(j["text"].get<std::string>());
    g.ids.push_back(j[kind].get<std::vector<int32_t>>());
  }
  return g;
}

void ExpectHfIds(const std::string& kind) {
  const Tokenizer tok =
      Tokenizer::FromFile(std::string(SSHSDP_TEXT_TESTDATA) + "/" + kind + ".json");
  const Golden g = Load(kind);
  ASSERT_GT(g.texts.size(), 60u);
  size_t bytes = 0, tokens = 0;
  for (size_t i = 0; i < g.texts.size(); ++i) {
    const std::vector<int32_t> ids = tok.Encode(g.texts[i]);
    EXPECT_EQ(ids, g.ids[i]) << kind << " document " << i << ": " << g.texts[i];
    // The round trip: added tokens come back as their text; NFC changes what it normalizes.
    if (kind == "gpt2_style") {
      EXPECT_EQ(tok.Decode(ids), g.texts[i]) << "document " << i;
    }
    bytes += g.texts[i].size(), tokens += ids.size();
  }
  EXPECT_EQ(tok.EncodeBatch(g.texts, 3), g.ids) << kind << " in parallel";
  EXPECT_GT(bytes, 10000u);
  EXPECT_GT(tokens, 1000u);
}

TEST(Tokenizer, Gpt2StyleEqualsHfTokenizers) { ExpectHfIds("gpt2_style"); }
TEST(Tokenizer, QwenStyleEqualsHfTokenizers) { ExpectHfIds("qwen_style"); }

TEST(Tokenizer, QwenStyleRoundTripsNfcText) {
  const Tokenizer tok = Tokenizer::FromFile(std::string(SSHSDP_TEXT_TESTDATA) + "/qwen_style.json");
  const std::string composed = "Caf\u00e9 cr\u00e8me <|im_end|> \U0001F680 x";
  EXPECT_EQ(tok.Decode(tok.Encode(composed)), composed);
  // Decomposed input is normalized (NFC) first: it comes back composed.
  EXPECT_EQ(tok.Decode(tok.Encode("Cafe\u0301")), "Caf\u00e9");
  EXPECT_EQ(tok.Decode(tok.Encode("a<|im_end|>b"), /*skip_special=*/true), "ab");
}

TEST(Tokenizer, NamesItsTokens) {
  const Tokenizer tok = Tokenizer::FromFile(std::string(SSHSDP_TEXT_TESTDATA) + "/gpt2_style.json");
  EXPECT_EQ(tok.vocab_size(), 800);
  ASSERT_TRUE(tok.EndOfText().has_value());
  EXPECT_EQ(*tok.EndOfText(), *tok.TokenId("<|endoftext|>"));
  EXPECT_EQ(tok.Encode("<|endoftext|>"), std::vector<int32_t>{*tok.EndOfText()});
  EXPECT_NE(tok.Describe().find("GPT-2 regex"), std::string::npos) << tok.Describe();
}

TEST(Tokenizer, InvalidUtf8IsRefusedWithItsOffset) {
  const Tokenizer tok = Tokenizer::FromFile(std::string(SSHSDP_TEXT_TESTDATA) + "/gpt2_style.json");
  try {
    tok.Encode("ok \xC3\x28 no");
    ADD_FAILURE() << "invalid UTF-8 encoded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte 3"), std::string::npos) << e.what();
  }
  // A token cut inside a character decodes to U+FFFD, as HF's from_utf8_lossy.
  const std::vector<int32_t> rocket = tok.Encode("\U0001F680");
  ASSERT_GT(rocket.size(), 1u);
  EXPECT_EQ(tok.Decode({rocket[0]}), "\xEF\xBF\xBD");
}

// Edits of the GPT-2-style file the reader must refuse, naming what it does not support.
TEST(Tokenizer, RefusesWhatItDoesNotImplementByName) {
  const nlohmann::json base = nlohmann::json::parse(Read("gpt2_style.json"));
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* message;
  };
  const Case cases[] = {
      {"WordPiece", [](auto& j) { j["model"]["type"] = "WordPiece"; }, "model 'WordPiece'"},
      {"dropout", [](auto& j) { j["model"]["dropout"] = 0.1; }, "BPE dropout"},
      {"prefix", [](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "continuing-subword prefix"},
      {"NFKC",
       [](auto& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       "normalizer 'NFKC'"},
      {"Metaspace",
       [](auto& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "pre-tokenizer 'Metaspace'"},
      {"lstrip", [](auto& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip"},
      {"decoder",
       [](auto& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder 'WordPiece'"},
      {"missing byte", [](auto& j) { j["model"]["vocab"].erase("\u0101"); }, "byte 0x01"},
      {"huge id", [](auto& j) { j["model"]["vocab"]["#"] = 1000000000000; },
       "token '#' has id 1000000000000, not an integer from 0 to 16777215"},
      {"negative id", [](auto& j) { j["model"]["vocab"]["#"] = -3; }, "has id -3"},
      {"huge added id", [](auto& j) { j["added_tokens"][0]["id"] = 2147483647; },
       "has id 2147483647, not an integer from 0 to 16777215"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = base;
    c.edit(j);
    try {
      Tokenizer::FromJson(j.dump(), "t.json");
      ADD_FAILURE() << c.what << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
          << c.what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("t.json"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Tokenizer::FromFile("/nonexistent/tokenizer.json"), IoError);
}

}  // namespace
}  // namespace sshsdp
