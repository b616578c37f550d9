// The extension module gpt1 builds on first use (`gpt1/inference/matvec.py`).
//
// The products and the step release Python's lock while they run, as torch's own operators do:
// they touch no Python object between reading their arguments and returning, and a step of the
// 117M model takes milliseconds in which `gpt1 serve`'s event loop (and its tokenizer thread)
// would otherwise wait.
#include "products.h"

namespace {
using Unlocked = pybind11::call_guard<pybind11::gil_scoped_release>;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("matvec", &matvec, "weight products for a few rows", Unlocked(), pybind11::arg("x"),
        pybind11::arg("w"), pybind11::arg("scale") = pybind11::none(),
        pybind11::arg("bias") = pybind11::none());
  m.def("set_one_row_stream", &set_one_row_stream,
        "one row of fp32 (or bf16 pairs): a channel at a time (True) or several side by side",
        pybind11::arg("bf16_pairs"), pybind11::arg("on"));
  m.def("has_decode_step", &has_decode_step, "whether decode_step was compiled for this CPU");
  m.def("decode_step", &decode_step, "every block of one decoding step", Unlocked(),
        pybind11::arg("x"),
        pybind11::arg("params"), pybind11::arg("keys"), pybind11::arg("values"),
        pybind11::arg("rows"), pybind11::arg("lengths"), pybind11::arg("n_head"),
        pybind11::arg("eps"), pybind11::arg("gelu"),
        pybind11::arg("packed") = std::vector<torch::Tensor>(), pybind11::arg("u8") = false);
  m.def("quantize_cache_rows", &quantize_cache_rows, "keys or values as an int8 cache's rows",
        Unlocked(), pybind11::arg("x"));
  m.def("gelu_fp32", &gelu_fp32, "GELU of fp32 numbers as decode_step computes it", Unlocked(),
        pybind11::arg("x"));
  m.def("greedy_tokens", &greedy_tokens, "each row's first largest logit, and whether all are finite",
        Unlocked(), pybind11::arg("logits"));
  m.def("draw_tokens", &draw_tokens, "each row's token drawn at a temperature, top-k and top-p",
        Unlocked(), pybind11::arg("logits"), pybind11::arg("rows"),
        pybind11::arg("temperatures"), pybind11::arg("top_ks"), pybind11::arg("top_ps"),
        pybind11::arg("uniforms"), pybind11::arg("vocab"), pybind11::arg("finite_only"));
  m.def("has_int8_rows", &has_int8_rows, "whether quantize_rows and scale_rows were compiled");
  m.def("quantize_rows", &quantize_rows, "activations to int8 with one scale per row",
        Unlocked(), pybind11::arg("x"));
  m.def("scale_rows", &scale_rows, "int8 products' sums times the row scales, plus the bias",
        Unlocked(), pybind11::arg("sums"), pybind11::arg("x_scale"), pybind11::arg("bias"),
        pybind11::arg("bf16"));
  m.def("pack_vnni", &pack_vnni, "an int8 weight in the few-row integer kernel's layout",
        Unlocked(), pybind11::arg("q"));
  m.def("has_few_rows_int8", &has_few_rows_int8, "whether gpt1's int8 kernel was compiled");
  m.def("int8_rows_form", &int8_rows_form,
        "how gpt1's int8 kernel quantises activation rows: 's8' or 'u7'");
  m.def("int8_rows_limit", &int8_rows_limit,
        "the most rows gpt1's int8 kernel takes where oneDNN's is exact (more on AMX)",
        pybind11::arg("in_features"));
  m.def("vnni_rows_limit", &vnni_rows_limit,
        "VNNI without AMX: the most rows gpt1's int8 kernel takes before oneDNN's; sets it to "
        "rows (16..64) unless rows is 0 and returns the one before (0: no such choice here)",
        pybind11::arg("rows") = 0);
  m.def("rows_product", &rows_product, "int8 products on gpt1's kernel, a scale per row",
        Unlocked(), pybind11::arg("x"), pybind11::arg("vnni"), pybind11::arg("scale"),
        pybind11::arg("bias"), pybind11::arg("out"));
  m.def("has_quantize_per_tensor", &has_quantize_per_tensor,
        "whether quantize_per_tensor was compiled for this CPU");
  m.def("bf16_table", &bf16_table, "a function of bf16 numbers, looked up in its table",
        Unlocked(), pybind11::arg("x"), pybind11::arg("table32"));
  m.def("quantize_per_tensor", &quantize_per_tensor,
        "activations to int8 with one scale for the whole tensor", Unlocked(), pybind11::arg("x"));
}
