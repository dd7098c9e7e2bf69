#include "examples/gpt/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "examples/gpt/error.hpp"
#include "examples/gpt/sha256.hpp"

namespace gpt {
namespace fs = std::filesystem;
namespace {

// 2: meta.json records sha256 of the sources and of the cache files (1 recorded sizes only).
constexpr int kCacheVersion = 2;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  GPT_CHECK(in, "cannot open '", path.string(), "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// The tokens of a cache file and the sha256 of its bytes.
std::vector<TokenId> read_tokens(const fs::path& path, std::string& sha) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  GPT_CHECK(in, "cannot open token cache '", path.string(), "'");
  const auto bytes = static_cast<std::size_t>(in.tellg());
  GPT_CHECK(bytes % sizeof(TokenId) == 0, "token cache '", path.string(), "' has an odd size ",
            bytes);
  std::vector<TokenId> tokens(bytes / sizeof(TokenId));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(bytes));
  GPT_CHECK(in, "cannot read token cache '", path.string(), "'");
  sha = sha256_hex(tokens.data(), bytes);
  return tokens;
}

void write_atomically(const fs::path& path, const void* data, std::size_t bytes) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    GPT_CHECK(out, "cannot create '", tmp.string(), "'");
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    GPT_CHECK(out, "cannot write ", bytes, " bytes to '", tmp.string(), "'");
  }
  fs::rename(tmp, path);
}

// What the cache was built from (the books' names and sha256, the tokenizer files' sha256,
// the split); a cache with different meta is rebuilt.
nlohmann::json source_meta(const std::vector<fs::path>& books, const std::vector<std::string>& texts,
                           double val_fraction) {
  nlohmann::json books_json = nlohmann::json::array();
  for (std::size_t i = 0; i < books.size(); ++i)
    books_json.push_back({{"name", books[i].filename().string()},
                          {"bytes", texts[i].size()},
                          {"sha256", sha256_hex(texts[i])}});
  return {{"version", kCacheVersion},
          {"val_fraction", val_fraction},
          {"encoder_sha256", kEncoderJsonSha256},
          {"vocab_sha256", kVocabBpeSha256},
          {"books", books_json}};
}

// Why a cache built from `cached` does not fit `now` (both source_meta), for the message.
std::string what_changed(const nlohmann::json& cached, const nlohmann::json& now) {
  if (!cached.is_object() || cached.value("version", 0) != kCacheVersion)
    return "it was written by another version of the cache format";
  if (cached.value("val_fraction", -1.0) != now.at("val_fraction").get<double>())
    return "it was split with another --val-fraction";
  const nlohmann::json none = nlohmann::json::array();
  const auto& old_books = cached.contains("books") ? cached.at("books") : none;
  const auto& new_books = now.at("books");
  for (std::size_t i = 0; i < std::max(old_books.size(), new_books.size()); ++i) {
    if (i >= old_books.size()) return detail::concat("book ", new_books[i].value("name", ""), " was added");
    if (i >= new_books.size()) return detail::concat("book ", old_books[i].value("name", ""), " was removed");
    if (old_books[i] != new_books[i])
      return detail::concat("book ", new_books[i].value("name", ""), " changed (sha256 ",
                            new_books[i].value("sha256", ""), ", the cache was built from ",
                            old_books[i].value("sha256", ""), ")");
  }
  return "it was built with other tokenizer files";
}

// The cached split if `meta_path` describes `source` and both files hash to what it
// records; else nullopt, with `why` saying what is wrong.
std::optional<TokenSplit> read_cache(const fs::path& cache_dir, const nlohmann::json& source, std::string& why) {
  const fs::path meta_path = cache_dir / "meta.json";
  if (!fs::exists(meta_path)) return std::nullopt;
  nlohmann::json cached;
  try {
    cached = nlohmann::json::parse(read_text(meta_path));
  } catch (const nlohmann::json::exception&) {
    cached = nullptr;
  }
  if (!cached.is_object()) {
    why = detail::concat("'", meta_path.string(), "' is not valid JSON");
    return std::nullopt;
  }
  if (cached.value("source", nlohmann::json()) != source) {
    why = what_changed(cached.value("source", nlohmann::json()), source);
    return std::nullopt;
  }
  TokenSplit split;
  for (auto [name, tokens] : {std::pair{"train", &split.train}, std::pair{"val", &split.val}}) {
    const fs::path file = cache_dir / (std::string(name) + ".bin");
    if (!fs::exists(file)) {
      why = detail::concat("'", file.string(), "' is missing");
      return std::nullopt;
    }
    std::string sha;
    *tokens = read_tokens(file, sha);
    const std::string recorded = cached.value(std::string(name) + "_sha256", "");
    if (sha != recorded) {
      why = detail::concat("'", file.string(), "' does not match its recorded sha256 (", sha, ", recorded ",
                           recorded, "): overwritten or damaged");
      return std::nullopt;
    }
  }
  return split;
}

}  // namespace

std::string normalize_newlines(std::string text) {
  std::size_t out = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    text[out++] = text[i];
  }
  text.resize(out);
  return text;
}

TokenSplit load_or_build_tokens(const std::string& data_dir_str, const std::string& cache_dir_str,
                                double val_fraction, int threads) {
  GPT_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "val_fraction ", val_fraction,
            " is not in [0, 1)");
  const fs::path data_dir(data_dir_str), cache_dir(cache_dir_str);
  const fs::path book_dir = data_dir / "gutenberg";
  GPT_CHECK(fs::is_directory(book_dir), "no books at '", book_dir.string(),
            "' (run scripts/fetch-data.sh ", data_dir_str, ")");
  std::vector<fs::path> books;
  for (const auto& e : fs::directory_iterator(book_dir))
    if (e.is_regular_file() && e.path().extension() == ".txt") books.push_back(e.path());
  std::sort(books.begin(), books.end());
  GPT_CHECK(!books.empty(), "no .txt books in '", book_dir.string(), "'");

  const std::string encoder_path = (data_dir / "encoder.json").string();
  const std::string vocab_path = (data_dir / "vocab.bpe").string();
  Tokenizer::verify_gpt2_files(encoder_path, vocab_path);  // even when the cache is reused
  std::vector<std::string> texts(books.size());
  for (std::size_t i = 0; i < books.size(); ++i) texts[i] = read_text(books[i]);
  const nlohmann::json meta = source_meta(books, texts, val_fraction);
  std::string why;
  if (auto cached = read_cache(cache_dir, meta, why)) return std::move(*cached);
  if (!why.empty())
    std::fprintf(stderr, "zoe-gpt: rebuilding the token cache '%s': %s\n", cache_dir.string().c_str(),
                 why.c_str());

  const Tokenizer tok = Tokenizer::load(encoder_path, vocab_path);  // verified above
  std::vector<std::vector<TokenId>> encoded(books.size());
  const int n_threads = std::max(1, std::min<int>(threads, static_cast<int>(books.size())));
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(n_threads);
  for (int t = 0; t < n_threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        EncodeCache cache;
        for (std::size_t i = t; i < books.size(); i += n_threads) {
          encoded[i] = tok.encode(normalize_newlines(std::move(texts[i])), cache);
          encoded[i].push_back(tok.end_of_text());
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);

  TokenSplit split;
  for (const auto& ids : encoded) {
    const auto n_val = static_cast<std::size_t>(std::llround(ids.size() * val_fraction));
    split.train.insert(split.train.end(), ids.begin(), ids.end() - n_val);
    split.val.insert(split.val.end(), ids.end() - n_val, ids.end());
  }
  fs::create_directories(cache_dir);
  write_atomically(cache_dir / "train.bin", split.train.data(), split.train.size() * 2);
  write_atomically(cache_dir / "val.bin", split.val.data(), split.val.size() * 2);
  const nlohmann::json written{{"source", meta},
                               {"train_tokens", split.train.size()},
                               {"val_tokens", split.val.size()},
                               {"train_sha256", sha256_hex(split.train.data(), split.train.size() * 2)},
                               {"val_sha256", sha256_hex(split.val.data(), split.val.size() * 2)}};
  const std::string text = written.dump(2);
  write_atomically(cache_dir / "meta.json", text.data(), text.size());
  return split;
}

double unigram_entropy(const std::vector<TokenId>& tokens) {
  if (tokens.empty()) return 0.0;
  std::vector<std::int64_t> counts(65536, 0);
  for (TokenId t : tokens) ++counts[t];
  const double n = static_cast<double>(tokens.size());
  double h = 0.0;
  for (std::int64_t c : counts)
    if (c > 0) h -= (c / n) * std::log(c / n);
  return h;
}

Batch sample_batch(const std::vector<TokenId>& tokens, int batch, int context,
                   std::mt19937_64& rng) {
  GPT_CHECK(tokens.size() > static_cast<std::size_t>(context) + 1, "token stream of ",
            tokens.size(), " tokens is too short for context ", context);
  const std::uint64_t starts = tokens.size() - context - 1;
  Batch b;
  b.inputs.resize(static_cast<std::size_t>(batch) * context);
  b.targets.resize(b.inputs.size());
  for (int w = 0; w < batch; ++w) {
    const std::size_t s = rng() % (starts + 1);
    for (int t = 0; t < context; ++t) {
      b.inputs[w * context + t] = tokens[s + t];
      b.targets[w * context + t] = tokens[s + t + 1];
    }
  }
  return b;
}

Batch sequential_batch(const std::vector<TokenId>& tokens, int batch, int context,
                       std::int64_t index) {
  GPT_CHECK(tokens.size() > static_cast<std::size_t>(context) + 1, "token stream of ",
            tokens.size(), " tokens is too short for context ", context);
  const std::uint64_t windows = (tokens.size() - 1) / context;
  Batch b;
  b.inputs.resize(static_cast<std::size_t>(batch) * context);
  b.targets.resize(b.inputs.size());
  for (int w = 0; w < batch; ++w) {
    const std::size_t s = ((index * batch + w) % windows) * context;
    for (int t = 0; t < context; ++t) {
      b.inputs[w * context + t] = tokens[s + t];
      b.targets[w * context + t] = tokens[s + t + 1];
    }
  }
  return b;
}

}  // namespace gpt
