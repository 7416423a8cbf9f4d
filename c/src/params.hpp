#pragma once
// kfa_params <-> kfa::Params, field for field. Internal to the C interface (the tests include it
// to check that every field of kfa::Params, as kfa::for_each_field lists them, goes through).
#include <kfa/kfa.h>
#include <kfa/params.hpp>

namespace kfa::c_api {

/// The C struct as kfa::Params; align and dq_mode must already be kfa_align and kfa_dq_mode
/// values.
inline Params to_params(const kfa_params& c) {
  Params p;
  p.scale = c.scale;
  p.causal = c.causal != 0;
  p.align = c.align == KFA_ALIGN_TOP_LEFT ? Align::top_left : Align::bottom_right;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  p.dropout = c.dropout;
  p.seed = c.seed;
  p.offset = c.offset;
  p.deterministic = c.deterministic != 0;
  p.num_splits = c.num_splits;
  p.dq_mode = static_cast<DqMode>(c.dq_mode);  // kfa_dq_mode's values are DqMode's, in order
  return p;
}

/// kfa::Params as the C struct (kfa_params_default is from_params(Params{})).
inline kfa_params from_params(const Params& p) {
  kfa_params c{};
  c.scale = p.scale;
  c.causal = p.causal ? 1 : 0;
  c.align = p.align == Align::top_left ? KFA_ALIGN_TOP_LEFT : KFA_ALIGN_BOTTOM_RIGHT;
  c.window_left = p.window_left;
  c.window_right = p.window_right;
  c.softcap = p.softcap;
  c.dropout = p.dropout;
  c.seed = p.seed;
  c.offset = p.offset;
  c.deterministic = p.deterministic ? 1 : 0;
  c.num_splits = p.num_splits;
  c.dq_mode = static_cast<int>(p.dq_mode);
  return c;
}

}  // namespace kfa::c_api
