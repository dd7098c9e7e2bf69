#include "src/torch/released_parameter.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>

#include "src/common/check.hpp"

namespace zoe::torch_detail {

namespace {

// The storage's deleter is how the fallback knows a tensor is one of ours; its context is the
// tag, freed with the storage (views share it).
void delete_tag(void* tag) { delete static_cast<std::string*>(tag); }

const std::string* tag_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const c10::DataPtr& data = t.storage().data_ptr();
  return data.get_deleter() == &delete_tag ? static_cast<const std::string*>(data.get_context()) : nullptr;
}

void refuse_released(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string* what = nullptr;
  for (const c10::IValue& v : *stack) {
    if (v.isTensor()) what = tag_of(v.toTensor());
    if (!what && v.isTensorList())
      for (const at::Tensor& t : v.toTensorList().vec())
        if ((what = tag_of(t))) break;
    if (what) break;
  }
  ZOE_THROW(UsageError, "TorchModel: ", what ? *what : std::string("a parameter of a zoe::TorchModel"), " was used by ",
            op.schema().name(), " outside TorchModel::run: zoe holds the values between runs (sharded at stage 3), so "
            "call the part through TorchModel::run and read parameters with Engine::gather_parameter");
}

}  // namespace

at::Tensor released_parameter(at::IntArrayRef shape, at::ScalarType dtype, std::string what) {
  auto* tag = new std::string(std::move(what));
  c10::DataPtr data(nullptr, tag, &delete_tag, c10::Device(c10::DeviceType::CPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, std::move(data), nullptr, false);
  const c10::DispatchKeySet keys = c10::DispatchKeySet(c10::DispatchKey::CPU) | c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), keys, c10::scalarTypeToTypeMeta(dtype));
  impl->set_sizes_contiguous(shape);
  return at::Tensor(std::move(impl));
}

}  // namespace zoe::torch_detail

// Every operator without a PrivateUse1 kernel of its own (all of them, in libtorch) comes here
// for a released parameter; autograd passes it through to that backend kernel.
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&zoe::torch_detail::refuse_released>());
}
TORCH_LIBRARY_IMPL(_, AutogradPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }
