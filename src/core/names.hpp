// The names a trainer gives the Engine (parameters, modules, param groups) are checked when
// they are registered: they become safetensors tensor names and checkpoint JSON keys (which
// must be UTF-8), C strings in what() (where a NUL byte would cut the message), and the way
// every error names a thing (an empty name names nothing). Refusing them at registration, on
// every rank alike, keeps a bad name from training for hours and failing at the first save on
// rank 0 only. Thread-safe (no state).
#pragma once

#include <cstddef>
#include <string_view>

namespace zoe::core {

/// What a name belongs to, for the error.
enum class NameKind : unsigned char { parameter, module, param_group };

/// Throws UsageError unless `name` is a usable name for the `index`-th (0-based, in
/// registration order) thing of `kind`: not empty, valid UTF-8 (RFC 3629), no NUL byte. The
/// message names the kind and index and shows the name escaped and shortened
/// (detail::quoted), e.g. "parameter 3: the name 'bad\xff\xfe' is not valid UTF-8 (byte 3 is 0xff)".
void check_name(NameKind kind, std::size_t index, std::string_view name);

/// Throws UsageError unless `text` is valid UTF-8 (it goes into a JSON document: a checkpoint's
/// client_state, a safetensors file's metadata). `what` names it in the message
/// ("save_checkpoint: client_state"), with the offending byte's offset and the text quoted.
void check_utf8(const char* what, std::string_view text);

}  // namespace zoe::core
