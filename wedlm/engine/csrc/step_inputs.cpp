// wedlm_cpu::step_inputs: the int64 inputs of a compiled CPU step of one sequence, built in one
// call (`runner.ModelRunner.prepare`): ids, positions and logit rows padded with zeros, and the
// paged-attention metadata `PagedAttention.build` gives for one sequence whose padded tokens are
// its padded queries (no gathers) and whose visibility is prefix lengths (`key_ends`). The numpy
// build runs about fifteen numpy calls and five tensor wraps per step, each in caches the
// weights' stream has just swept; this is one call.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

namespace {

at::Tensor int64_tensor(at::IntArrayRef sizes) { return at::empty(sizes, at::TensorOptions().dtype(at::kLong)); }

// [input_ids [tokens], positions [tokens], logit_rows [rows], slot_mapping [tokens],
// kv_slots [1, keys], key_ends [1, tokens]] for n = len(ids) fed tokens after context_len cached
// ones: padded tokens feed id 0 at position 0 and write into pad_slot; padded keys read pad_slot;
// fed query j sees keys 0..context_len + j, a padded query every key (its output is dropped).
std::vector<at::Tensor> step_inputs(at::IntArrayRef ids, at::IntArrayRef positions, at::IntArrayRef rows,
                                    at::IntArrayRef block_table, int64_t context_len, int64_t block_size,
                                    int64_t tokens, int64_t keys, int64_t padded_rows, int64_t pad_slot) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t total = context_len + n;
  TORCH_CHECK(n >= 1 && static_cast<int64_t>(positions.size()) == n, "wedlm_cpu::step_inputs: ", n, " ids and ",
              positions.size(), " positions (at least one token)");
  TORCH_CHECK(context_len >= 0 && block_size >= 1, "wedlm_cpu::step_inputs: context_len ", context_len,
              ", block_size ", block_size);
  TORCH_CHECK(static_cast<int64_t>(block_table.size()) * block_size >= total, "wedlm_cpu::step_inputs: block_table of ",
              block_table.size(), " blocks x ", block_size, " covers fewer than context_len + query_len = ", total,
              " positions");
  TORCH_CHECK(tokens >= n && keys >= total && padded_rows >= static_cast<int64_t>(rows.size()),
              "wedlm_cpu::step_inputs: padded sizes (tokens ", tokens, ", keys ", keys, ", rows ", padded_rows,
              ") below the real ones (", n, ", ", total, ", ", rows.size(), ")");
  at::Tensor id_t = int64_tensor({tokens}), pos_t = int64_tensor({tokens}), row_t = int64_tensor({padded_rows});
  at::Tensor slot_t = int64_tensor({tokens}), kv_t = int64_tensor({1, keys}), end_t = int64_tensor({1, tokens});
  int64_t *id = id_t.data_ptr<int64_t>(), *pos = pos_t.data_ptr<int64_t>(), *row = row_t.data_ptr<int64_t>();
  int64_t *slot = slot_t.data_ptr<int64_t>(), *kv = kv_t.data_ptr<int64_t>(), *end = end_t.data_ptr<int64_t>();
  for (int64_t p = 0; p < keys; ++p)
    kv[p] = p < total ? block_table[p / block_size] * block_size + p % block_size : pad_slot;
  for (int64_t j = 0; j < tokens; ++j) {
    const bool fed = j < n;
    id[j] = fed ? ids[j] : 0;
    pos[j] = fed ? positions[j] : 0;
    slot[j] = fed ? kv[context_len + j] : pad_slot;
    end[j] = fed ? context_len + j + 1 : keys;
  }
  for (int64_t r = 0; r < padded_rows; ++r) row[r] = r < static_cast<int64_t>(rows.size()) ? rows[r] : 0;
  return {id_t, pos_t, row_t, slot_t, kv_t, end_t};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(wedlm_cpu, m) {
  m.def(
      "step_inputs(int[] ids, int[] positions, int[] rows, int[] block_table, int context_len, int block_size, "
      "int tokens, int keys, int padded_rows, int pad_slot) -> Tensor[]",
      step_inputs);
}
