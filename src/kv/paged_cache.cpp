#include "kv/paged_cache.h"

#include "core/error.h"

namespace osprey {
namespace {

class PagedLayerView final : public KVCache {
 public:
  PagedLayerView(PagedPool& pool, size_t layer, const PagedStep& step) : pool_(pool), layer_(layer), step_(step) {}

  KVView update_and_fetch(const Array& k, const Array& v, const Array& positions) override {
    const Array& keys = pool_.keys(layer_);
    const Array& values = pool_.values(layer_);
    ops::write_kv_paged(keys, values, k, v, step_.slots);
    KVView view;
    view.positions = positions;
    if (step_.decode) {
      view.keys = keys;
      view.values = values;
      view.layout = ops::PagedKeys{step_.block_tables, step_.seq_lens, step_.split_keys};
      view.max_keys = step_.block_tables.dim(1) * pool_.block_size();
      return view;
    }
    view.keys = ops::gather_kv_blocks(keys, step_.block_ids, step_.n_rows);
    view.values = ops::gather_kv_blocks(values, step_.block_ids, step_.n_rows);
    view.pos0 = step_.pos0;
    view.max_keys = step_.n_rows;
    return view;
  }

  int64_t offset() const override { return step_.decode ? 0 : step_.pos0; }
  int64_t capacity() const override { return pool_.n_blocks() * pool_.block_size(); }
  void trim(int64_t) override { unsupported("trim"); }
  KVState snapshot() const override { unsupported("snapshot"); }
  void restore(const KVState&) override { unsupported("restore"); }
  KVState detach() override { unsupported("detach"); }
  KVCounters counters() const override { return {}; }

 private:
  [[noreturn]] static void unsupported(const char* what) {
    throw Unsupported(std::string("paged step cache: ") + what + " belongs to the pool (kv/paged_pool.h)");
  }

  PagedPool& pool_;
  size_t layer_;
  const PagedStep& step_;
};

}  // namespace

SequenceCache make_paged_step_cache(PagedPool& pool, const PagedStep& step) {
  std::vector<std::unique_ptr<KVCache>> layers;
  for (size_t l = 0; l < pool.n_layers(); ++l) layers.push_back(std::make_unique<PagedLayerView>(pool, l, step));
  return SequenceCache(std::move(layers));
}

}  // namespace osprey
