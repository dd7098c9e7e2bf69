// Locates the trainer's data for tests: scripts/fetch-data.sh --from a local source
// ($ZOE_GPT_DATA, <repo>/data/gpt, /work/shared/data), extracted into the build tree once.
#pragma once

#include <optional>
#include <string>

namespace gpt::test {
/// The data dir (encoder.json, vocab.bpe, gutenberg/), or nullopt with `why` set when no local
/// source exists (the tests then skip, printing why; they never use the network).
std::optional<std::string> data_dir(std::string& why);
}  // namespace gpt::test
