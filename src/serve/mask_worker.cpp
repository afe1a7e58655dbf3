#include "serve/mask_worker.h"

#include <stdexcept>
#include <utility>

#include "grammar/matcher.h"

namespace osprey {

MaskWorker::~MaskWorker() { stop(); }

void MaskWorker::start(std::vector<grammar::Matcher*> matchers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) throw std::logic_error("mask worker: a batch is already in flight");
    if (stopping_) throw std::logic_error("mask worker: started after stop()");
    batch_ = std::move(matchers);
    error_ = nullptr;
    busy_ = true;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  cv_.notify_all();
}

void MaskWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void MaskWorker::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MaskWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return busy_ || stopping_; });
    if (!busy_) return;
    const std::vector<grammar::Matcher*> batch = std::move(batch_);
    lock.unlock();
    std::exception_ptr error;
    for (grammar::Matcher* m : batch) {
      try {
        m->mask();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    lock.lock();
    error_ = error;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace osprey
