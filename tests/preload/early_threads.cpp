// Preloaded into `osprey serve` by CliServe.SignalsLandingOnThreadsStartedBeforeMainDrain: starts
// threads before main() with the default signal mask, as the CUDA driver does once a device is
// selected and as tools that inject themselves into a process do. A SIGTERM that the kernel
// hands to one of them must drain the server, not end the process.
#include <pthread.h>
#include <unistd.h>

namespace {

void* idle(void*) {
  for (;;) ::pause();
  return nullptr;
}

__attribute__((constructor)) void start_early_threads() {
  for (int i = 0; i < 8; ++i) {
    pthread_t t;
    if (::pthread_create(&t, nullptr, idle, nullptr) == 0) ::pthread_detach(t);
  }
}

}  // namespace
