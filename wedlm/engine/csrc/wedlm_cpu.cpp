// The library `native.py` builds: the engine's operators in one translation unit, because
// parsing torch's headers is most of the build time (three units took ~26 s on one core).
#include "few_rows_mm.cpp"
#include "greedy_scores.cpp"
#include "linear.cpp"
#include "one_query_attention.cpp"
#include "one_row_mm.cpp"
#include "step_inputs.cpp"
#include "window_attention.cpp"
