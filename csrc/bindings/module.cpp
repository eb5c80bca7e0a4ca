// stoker._core: the only translation unit set that includes pybind11.
#include <pybind11/pybind11.h>

#include <cstdlib>
#include <string>

#include "codecs/codecs.h"
#include "codecs/media.h"
#include "common/error.h"

#ifndef STOKER_VERSION
#define STOKER_VERSION "unknown"  // built outside scikit-build-core
#endif

namespace py = pybind11;

namespace {

// Raises `e` as the Python exception `type`: the message is the user's (their file, record
// and the fix); where in csrc/ it was raised goes to the exception's `source_location`,
// for bug reports, and into the message only with STOKER_DEBUG=1.
void set_error(py::handle type, const stoker::Error& e) {
  std::string message = e.what();
  const char* debug = std::getenv("STOKER_DEBUG");
  const bool show = debug != nullptr && *debug != '\0' && std::string(debug) != "0";
  if (show && !e.where().empty()) message += " [" + e.where() + "]";
  try {
    py::object exc = py::reinterpret_borrow<py::object>(type)(message);
    exc.attr("source_location") = e.where().empty() ? py::object(py::none()) : py::str(e.where());
    PyErr_SetObject(type.ptr(), exc.ptr());
  } catch (const py::error_already_set&) {
    PyErr_SetString(type.ptr(), message.c_str());
  }
}

}  // namespace

namespace stoker::bindings {
void register_format(py::module_& m);
void register_image_ops(py::module_& m);
void register_loader(py::module_& m);
void register_decode(py::module_& m);
void register_cuda(py::module_& m);
void register_checksum(py::module_& m);
void register_tokens(py::module_& m);
void register_fetch_plan(py::module_& m);
void register_mixture(py::module_& m);
void register_python_stage(py::module_& m);
void register_cache(py::module_& m);
void register_media(py::module_& m);
}  // namespace stoker::bindings

// Free-threading ready (docs/python.md, "Threads or processes"): the bindings touch Python
// objects only while attached, and every wait, read and decode runs detached.
PYBIND11_MODULE(_core, m, py::mod_gil_not_used()) {
  m.doc() = "stoker's native core (private; use the stoker package)";

  // Translators run last-registered first: derived types after their bases.
  static py::exception<stoker::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<stoker::DataError> data_error(m, "DataError", error.ptr());
  static py::exception<stoker::DecodeError> decode_error(m, "DecodeError", data_error.ptr());
  static py::exception<stoker::CudaError> cuda_error(m, "CudaError", error.ptr());
  // Errors raised in Python (stoker.DataError("...")) have no source location.
  for (py::handle type : {error.ptr(), data_error.ptr(), decode_error.ptr(), cuda_error.ptr()})
    py::setattr(type, "source_location", py::none());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const stoker::UsageError& e) {
      set_error(PyExc_ValueError, e);
    } catch (const stoker::DecodeError& e) {
      set_error(decode_error, e);
    } catch (const stoker::DataError& e) {
      set_error(data_error, e);
    } catch (const stoker::CudaError& e) {
      set_error(cuda_error, e);
    } catch (const stoker::FetchError& e) {
      // The Python layer's own exception type (an OSError), so that one except
      // clause catches a failed download wherever it surfaces.
      try {
        set_error(py::module_::import("stoker.remote").attr("RemoteError"), e);
      } catch (const py::error_already_set&) {
        set_error(error, e);
      }
    } catch (const stoker::Error& e) {
      set_error(error, e);
    }
  });

  m.attr("__version__") = STOKER_VERSION;
  m.def(
      "build_info",
      [] {
        py::dict info;
        info["version"] = STOKER_VERSION;
        info["images"] = stoker::have_image_codecs();
        info["codecs"] = stoker::image_codec_versions();
        info["video"] = stoker::have_media_codecs();
        info["media"] = stoker::media_codec_versions();
        return info;
      },
      "How this extension was built: version, whether image fields can be decoded, and the "
      "codec libraries' versions; whether video and audio fields can (video), and FFmpeg's "
      "versions (media).");

  stoker::bindings::register_format(m);
  stoker::bindings::register_image_ops(m);
  stoker::bindings::register_loader(m);
  stoker::bindings::register_decode(m);
  stoker::bindings::register_cuda(m);
  stoker::bindings::register_checksum(m);
  stoker::bindings::register_tokens(m);
  stoker::bindings::register_cache(m);
  stoker::bindings::register_media(m);
  stoker::bindings::register_fetch_plan(m);
  stoker::bindings::register_mixture(m);
  stoker::bindings::register_python_stage(m);
}
