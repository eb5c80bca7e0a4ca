// Bindings of csrc/cache: the decoded-sample cache a loader keeps decoded images
// in (stoker.Loader(..., cache="decoded")), opened by the Python layer, handed to
// the record producer through RecordOptions, and read for Loader.stats().
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <memory>
#include <string>

#include "cache/decoded_cache.h"

namespace py = pybind11;

namespace stoker::bindings {

void register_cache(py::module_& m) {
  py::class_<DecodedCache, std::shared_ptr<DecodedCache>>(
      m, "DecodedCache",
      "Decoded images kept for later epochs, shared by the processes of a node that read the "
      "same dataset (csrc/cache/decoded_cache.h).")
      .def(py::init([](int64_t budget, int64_t slots, int variants, int max_side, uint64_t identity,
                       const std::string& dir, int64_t private_budget, bool verify_always) {
             DecodedCacheOptions o;
             o.budget = budget;
             o.slots = slots;
             o.variants = variants;
             o.max_side = max_side;
             o.identity = identity;
             o.dir = dir;
             o.private_budget = private_budget;
             o.verify_always = verify_always;
             py::gil_scoped_release nogil;  // joining may wait for another process
             return DecodedCache::open(o);
           }),
           py::kw_only(), py::arg("budget"), py::arg("slots"), py::arg("variants") = 4,
           py::arg("max_side") = 0, py::arg("identity") = 0, py::arg("dir") = "/dev/shm",
           py::arg("private_budget") = 0, py::arg("verify_always") = false,
           "budget: bytes of the whole cache (index and entries); slots: records x image "
           "fields; variants: 4 (exact pixels, one entry per JPEG DCT scale) or 1 (max_side: one "
           "reduced copy); identity: the dataset's content and the cache's parameters; dir: "
           "where the shared file's private folder lives ('' = private memory only); "
           "private_budget: the budget of a private cache made when the shared one cannot be "
           "had (0: budget); verify_always: check an entry's checksum on every read (else on "
           "its first read in this process).")
      .def_static("index_bytes", &DecodedCache::index_bytes, py::arg("slots"), py::arg("variants"),
                  "Bytes the cache's index takes: a budget needs more than this.")
      .def_property_readonly("shared", &DecodedCache::shared)
      .def_property_readonly("path", &DecodedCache::path)
      .def_property_readonly("fallback", &DecodedCache::fallback,
                             "Why the cache is private although a shared one was asked for.")
      .def_property_readonly("abandoned", &DecodedCache::abandoned_why,
                             "Why this process left the shared cache for a private one (an "
                             "entry failed its check); empty while it reads it.")
      .def_static("private_dir", &DecodedCache::private_dir, py::arg("dir"),
                  "The folder of this user's shared caches in `dir`.")
      .def_property_readonly("budget", [](const DecodedCache& c) { return c.stats().budget; })
      .def_property_readonly("slots", [](const DecodedCache& c) { return c.options().slots; })
      .def(
          "image",
          [](const DecodedCache& c, int64_t slot, int variant) -> py::object {
            CachedImage e;
            if (!c.find(slot, variant, &e)) return py::none();
            py::array_t<uint8_t> out({e.pix.height, e.pix.width, 3});
            auto* dst = out.mutable_data();
            for (int y = 0; y < e.pix.height; ++y)
              std::memcpy(dst + static_cast<size_t>(y) * e.pix.width * 3,
                          e.pix.data + static_cast<size_t>(y) * e.pix.stride,
                          static_cast<size_t>(e.pix.width) * 3);
            return py::make_tuple(out, py::make_tuple(e.full_h, e.full_w));
          },
          py::arg("slot"), py::arg("variant"),
          "(pixels (h, w, 3) uint8, (full_h, full_w)) of an entry, or None.")
      .def("stats", [](const DecodedCache& c) {
        const DecodedCacheStats s = c.stats();
        py::dict d;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["inserts"] = s.inserts;
        d["declined"] = s.declined;
        d["entries"] = s.entries;
        d["images"] = s.images;
        d["slots"] = s.slots;
        d["bytes"] = s.bytes;
        d["budget"] = s.budget;
        d["shared"] = s.shared;
        d["full"] = s.full;
        d["verified"] = s.verified;
        d["corrupt"] = s.corrupt;
        d["abandoned"] = s.abandoned;
        return d;
      });
}

}  // namespace stoker::bindings
