#include "examples/gpt/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "examples/gpt/error.hpp"

namespace gpt {
namespace fs = std::filesystem;
namespace {

constexpr int kCacheVersion = 1;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  GPT_CHECK(in, "cannot open '", path.string(), "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::vector<TokenId> read_tokens(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  GPT_CHECK(in, "cannot open token cache '", path.string(), "'");
  const auto bytes = static_cast<std::size_t>(in.tellg());
  GPT_CHECK(bytes % sizeof(TokenId) == 0, "token cache '", path.string(), "' has an odd size ",
            bytes);
  std::vector<TokenId> tokens(bytes / sizeof(TokenId));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(bytes));
  GPT_CHECK(in, "cannot read token cache '", path.string(), "'");
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

// What the cache was built from; a cache with different meta is rebuilt.
nlohmann::json source_meta(const std::vector<fs::path>& books, const fs::path& data_dir,
                           double val_fraction) {
  nlohmann::json books_json = nlohmann::json::array();
  for (const auto& b : books)
    books_json.push_back({{"name", b.filename().string()}, {"bytes", fs::file_size(b)}});
  return {{"version", kCacheVersion},
          {"val_fraction", val_fraction},
          {"encoder_bytes", fs::file_size(data_dir / "encoder.json")},
          {"vocab_bytes", fs::file_size(data_dir / "vocab.bpe")},
          {"books", books_json}};
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

  const nlohmann::json meta = source_meta(books, data_dir, val_fraction);
  const fs::path meta_path = cache_dir / "meta.json";
  if (fs::exists(meta_path)) {
    nlohmann::json cached;
    try {
      cached = nlohmann::json::parse(read_text(meta_path));
    } catch (const nlohmann::json::exception&) {
      cached = nullptr;  // unreadable: rebuild below
    }
    if (cached.is_object() && cached.value("source", nlohmann::json()) == meta) {
      TokenSplit split{read_tokens(cache_dir / "train.bin"), read_tokens(cache_dir / "val.bin")};
      if (split.train.size() == cached.value("train_tokens", std::size_t{0}) &&
          split.val.size() == cached.value("val_tokens", std::size_t{0}))
        return split;
    }
  }

  const Tokenizer tok = Tokenizer::load((data_dir / "encoder.json").string(),
                                        (data_dir / "vocab.bpe").string());
  std::vector<std::vector<TokenId>> encoded(books.size());
  const int n_threads = std::max(1, std::min<int>(threads, static_cast<int>(books.size())));
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(n_threads);
  for (int t = 0; t < n_threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        EncodeCache cache;
        for (std::size_t i = t; i < books.size(); i += n_threads) {
          encoded[i] = tok.encode(normalize_newlines(read_text(books[i])), cache);
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
                               {"val_tokens", split.val.size()}};
  const std::string text = written.dump(2);
  write_atomically(meta_path, text.data(), text.size());
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
