// zoe::SafetensorsFile: a validated safetensors file (io::SafetensorsReader) handing out
// ParamInitializers. An initializer call reads exactly the bytes of the elements asked for (one
// pread) and widens them to fp32 with the engine's own conversions (host_ops::cast: exact for
// bf16 and fp16), so each rank reads only its part of each parameter, a sub-group at a time.
#include "zoe/safetensors.hpp"

#include <algorithm>
#include <bit>

#include "io/safetensors.hpp"
#include "src/common/boundary_errors.hpp"
#include "src/common/check.hpp"
#include "src/common/quote.hpp"
#include "src/device/host_elementwise.hpp"

namespace zoe {

// safetensors is little-endian; zoe reads and writes the host's bytes as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

struct SafetensorsFile::Impl {
  explicit Impl(const std::string& path) : reader(path) {
    for (const io::SafetensorsEntry& e : reader.header().tensors) tensors.push_back({e.name, e.dtype, e.shape, e.numel});
  }
  io::SafetensorsReader reader;
  std::vector<SafetensorsTensor> tensors;  // the header's, in file order
};

namespace {
// The zoe dtype a safetensors dtype widens from exactly; false if it is not one zoe imports.
bool importable(const std::string& st, DType& out) {
  if (st == "F32") out = DType::f32;
  else if (st == "BF16") out = DType::bf16;
  else if (st == "F16") out = DType::f16;
  else return false;
  return true;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::~SafetensorsFile() = default;

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  return detail::at_public_boundary("SafetensorsFile::open", [&] {
    return std::shared_ptr<const SafetensorsFile>(new SafetensorsFile(std::make_unique<Impl>(path)));
  });
}

const std::string& SafetensorsFile::path() const noexcept { return impl_->reader.path(); }
const std::vector<SafetensorsTensor>& SafetensorsFile::tensors() const noexcept { return impl_->tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const noexcept {
  return impl_->reader.header().metadata;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const noexcept {
  for (const SafetensorsTensor& t : impl_->tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void SafetensorsFile::read_f32(const std::string& name, std::int64_t offset, std::span<float> out) const {
  const io::SafetensorsEntry* e = impl_->reader.header().find(name);
  ZOE_CHECK_USAGE(e, "safetensors file ", detail::quoted_path(path()), " has no tensor ", detail::quoted(name));
  DType dt{};
  ZOE_CHECK_USAGE(importable(e->dtype, dt), "safetensors file ", detail::quoted_path(path()), ": tensor ", detail::quoted(name), " is ", e->dtype,
                  "; zoe imports F32, BF16 and F16");
  const auto n = static_cast<std::int64_t>(out.size());
  ZOE_CHECK_USAGE(offset >= 0 && offset <= e->numel && n <= e->numel - offset, "safetensors file ", detail::quoted_path(path()),
                  ": elements [", offset, ", ", offset + n, ") lie outside tensor ", detail::quoted(name), " (", e->numel,
                  " elements)");
  const std::size_t esz = dtype_size(dt);
  if (dt == DType::f32) {
    impl_->reader.read(*e, static_cast<std::uint64_t>(offset) * esz, out.data(), out.size() * esz);
    return;
  }
  // 16-bit: read into the upper half of `out`, widen front to back (the fp32 element i never
  // overtakes the 16-bit element i it comes from).
  auto* raw = reinterpret_cast<std::byte*>(out.data()) + out.size() * (sizeof(float) - esz);
  impl_->reader.read(*e, static_cast<std::uint64_t>(offset) * esz, raw, out.size() * esz);
  constexpr std::size_t kBlock = 4096;
  std::vector<std::uint16_t> block(std::min(out.size(), kBlock));
  for (std::size_t at = 0; at < out.size(); at += kBlock) {
    const std::size_t m = std::min(kBlock, out.size() - at);
    std::copy_n(reinterpret_cast<const std::uint16_t*>(raw) + at, m, block.data());  // raw may overlap out[at..]
    host_ops::cast(block.data(), dt, out.data() + at, DType::f32, m);
  }
}

ParamInitializer SafetensorsFile::initializer(const std::string& name, const std::vector<std::int64_t>& shape) const {
  const SafetensorsTensor* t = find(name);
  ZOE_CHECK_USAGE(t, "safetensors file ", detail::quoted_path(path()), " has no tensor ", detail::quoted(name), " (it has ", tensors().size(),
                  " tensors", tensors().empty() ? "" : ", the first " + detail::quoted(tensors().front().name), ")");
  DType dt{};
  ZOE_CHECK_USAGE(importable(t->dtype, dt), "safetensors file ", detail::quoted_path(path()), ": tensor ", detail::quoted(name), " is ", t->dtype,
                  "; zoe imports F32, BF16 and F16");
  ZOE_CHECK_USAGE(t->shape == shape, "safetensors file ", detail::quoted_path(path()), ": tensor ", detail::quoted(name), " has shape ",
                  shape_text(t->shape), ", the parameter ", shape_text(shape));
  return [file = shared_from_this(), name](std::int64_t offset, std::span<float> out) {
    file->read_f32(name, offset, out);
  };
}

}  // namespace zoe
