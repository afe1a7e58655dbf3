#include "kv/paged_cache.h"

#include "core/error.h"

namespace osprey {
namespace {

class PagedLayerView final : public KVCache {
 public:
  PagedLayerView(PagedPools& pools, size_t layer, const PagedStep& step)
      : pools_(pools), layer_(layer), group_(pools.group_of(layer)), step_(step) {}

  KVView update_and_fetch(const Array& k, const Array& v, const Array& positions) override {
    const Array& keys = pools_.keys(layer_);
    const Array& values = pools_.values(layer_);
    const PagedGroupStep& g = step_.groups.at(group_);
    ops::write_kv_paged(keys, values, k, v, g.slots, pools_.layer_params(layer_).row_scales());
    KVView view;
    view.positions = positions;
    if (step_.decode) {
      view.keys = keys;
      view.values = values;
      view.layout = ops::PagedKeys{g.block_tables, step_.seq_lens, step_.split_keys};
      view.max_keys = g.block_tables.dim(1) * pools_.block_size();
      return view;
    }
    view.keys = ops::gather_kv_blocks(keys, g.block_ids, step_.n_rows - g.key_pos0);
    view.values = ops::gather_kv_blocks(values, g.block_ids, step_.n_rows - g.key_pos0);
    view.pos0 = step_.pos0;
    view.layout = ops::LinearKeys{g.key_pos0};
    view.max_keys = step_.n_rows - g.key_pos0;
    return view;
  }

  int64_t offset() const override { return step_.decode ? 0 : step_.pos0; }
  int64_t capacity() const override { return pools_.group(group_).n_blocks() * pools_.block_size(); }
  void trim(int64_t) override { unsupported("trim"); }
  KVState snapshot() const override { unsupported("snapshot"); }
  void restore(const KVState&) override { unsupported("restore"); }
  KVState detach() override { unsupported("detach"); }
  KVCounters counters() const override { return {}; }

 private:
  [[noreturn]] static void unsupported(const char* what) {
    throw Unsupported(std::string("paged step cache: ") + what + " belongs to the pools (kv/paged_pools.h)");
  }

  PagedPools& pools_;
  size_t layer_;
  size_t group_;
  const PagedStep& step_;
};

}  // namespace

SequenceCache make_paged_step_cache(PagedPools& pools, const PagedStep& step) {
  std::vector<std::unique_ptr<KVCache>> layers;
  for (size_t l = 0; l < pools.n_layers(); ++l) layers.push_back(std::make_unique<PagedLayerView>(pools, l, step));
  return SequenceCache(std::move(layers));
}

}  // namespace osprey
