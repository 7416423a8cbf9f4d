#pragma once
// kfa mha forward|backward: kfa::nn's multi-head attention block on HDF5 files or a random
// problem (mha.cpp, built with kfa::nn; without it `kfa mha` says that it is not built).

#include <string>
#include <vector>

#include "cli.hpp"

namespace kfa_cli {

/// What `kfa mha` takes besides the shared run options (o.params holds the attention's).
struct MhaOptions {
  int heads = 0;                     ///< --heads H: query heads
  int heads_kv = 0;                  ///< --heads-kv HKV: key/value heads (0: H)
  bool residual_layer_norm = false;  ///< --residual-layernorm
  double eps = 1e-5;                 ///< --eps E: the layer norm's
  bool eps_given = false;            ///< whether --eps was given (it needs the layer norm)
  std::vector<long long> random;     ///< --random B,L,DMODEL
};

/// The usage text of `kfa mha`.
extern const char* const kMhaUsage;

/// Parses `kfa mha forward|backward [flags]` (argv[1] is "mha") into o (command "forward" or
/// "backward", the attention's pass flags in o.params) and m; throws kfa_apps::InputError
/// naming the flag.
void parse_mha(int argc, char** argv, kfa_apps::RunOptions& o, MhaOptions& m);

/// Runs the pass; returns the exit status (1 when --check finds the rule broken).
int run_mha(kfa_apps::RunOptions o, const MhaOptions& m);

}  // namespace kfa_cli
