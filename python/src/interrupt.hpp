// Ctrl-C during a long native call. Python runs signal handlers only on the main thread, and only
// when that thread holds the GIL and checks for them; a call that releases the GIL for seconds
// would otherwise let KeyboardInterrupt wait until it returns.
//
// run_interruptible(work) runs `work(token)` on a worker thread while the calling thread waits in
// 50 ms steps with the GIL released, taking it back between steps to call PyErr_CheckSignals().
// When a handler raises (SIGINT's default raises KeyboardInterrupt), the token is cancelled, the
// call is waited for (the store polls the token between chunks, so that is quick, and a cancelled
// write or reindex leaves nothing half done), and the handler's exception is raised in place of
// the result. A call from another thread than the main one cannot see signals: it runs in place
// with the GIL released and no token, as before.
//
// `work` must not touch Python objects (it runs without the GIL); any C++ exception it throws
// (StatusError) is re-thrown on the calling thread.
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <optional>
#include <utility>

#include "gpuopt/core/cancel.hpp"

namespace gpuopt::python {

// True on the interpreter's main thread (the one Python runs signal handlers on). Needs the GIL.
// The ident is cached in an atomic, not a function-local static: the import may release the GIL,
// and a static's initialisation guard would then block a second thread that holds it.
inline bool on_main_thread() {
  static std::atomic<unsigned long> main_ident{0};
  unsigned long ident = main_ident.load(std::memory_order_relaxed);
  if (ident == 0) {
    namespace nb = nanobind;
    nb::object thread = nb::module_::import_("threading").attr("main_thread")();
    ident = nb::cast<unsigned long>(thread.attr("ident"));
    main_ident.store(ident, std::memory_order_relaxed);
  }
  return PyThread_get_thread_ident() == ident;
}

// Called with the GIL held. Returns what work(const CancelToken*) returns.
template <typename Work>
auto run_interruptible(Work&& work) -> decltype(work(static_cast<const CancelToken*>(nullptr))) {
  namespace nb = nanobind;
  if (!on_main_thread()) {
    nb::gil_scoped_release release;
    return work(nullptr);
  }
  CancelToken token;
  auto future = std::async(std::launch::async, [&work, &token] { return work(&token); });
  std::optional<nb::python_error> interrupt;
  for (;;) {
    {
      nb::gil_scoped_release release;
      if (future.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready) break;
    }
    if (!interrupt && PyErr_CheckSignals() != 0) {
      interrupt.emplace();  // takes the handler's exception (KeyboardInterrupt) out of Python
      token.cancel();
    }
  }
  if (interrupt) {
    // The call may have completed just before it saw the token; either way the interrupt wins,
    // as it would have right after a call that returned (its effect, if any, is whole).
    try {
      future.get();
    } catch (...) {
    }
    throw std::move(*interrupt);
  }
  return future.get();
}

}  // namespace gpuopt::python
