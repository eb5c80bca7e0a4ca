#include "bindings/dlpack.h"

#include <cstring>
#include <vector>

namespace stoker::bindings {

namespace {

// The DLPack ABI (v0.x, unversioned "dltensor" capsules), declared here so
// the build needs no extra header. Field order and types are fixed by the ABI.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null = C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct Holder {
  std::shared_ptr<uint8_t> base;  // keeps the slot / device buffer alive
  std::vector<int64_t> shape;
  DLManagedTensor managed;
};

void delete_managed(DLManagedTensor* self) {
  delete static_cast<Holder*>(self->manager_ctx);  // may return memory to its pool
}

void capsule_destructor(PyObject* capsule) {
  // A consumer renames the capsule to "used_dltensor" and takes ownership;
  // only an unconsumed capsule still owns the tensor.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  }
}

}  // namespace

py::capsule make_dlpack_capsule(const std::shared_ptr<uint8_t>& base, const TensorDesc& desc,
                                int device_type, int device_id) {
  auto* h = new Holder{base, desc.shape, {}};
  DLTensor& t = h->managed.dl_tensor;
  t.data = base.get() + desc.offset;
  t.device = {device_type, device_id};
  t.ndim = static_cast<int32_t>(h->shape.size());
  DLTypeCode code = dtype_dlpack(desc.dtype);
  t.dtype = {code.code, code.bits, 1};
  t.shape = h->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  h->managed.manager_ctx = h;
  h->managed.deleter = delete_managed;
  PyObject* cap = PyCapsule_New(&h->managed, "dltensor", capsule_destructor);
  if (!cap) {
    delete h;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

py::list batch_to_capsules(const std::shared_ptr<uint8_t>& base,
                           const std::vector<TensorDesc>& tensors, int device_type, int device_id) {
  py::list out;
  for (const TensorDesc& d : tensors)
    out.append(py::make_tuple(d.name, make_dlpack_capsule(base, d, device_type, device_id)));
  return out;
}

}  // namespace stoker::bindings
