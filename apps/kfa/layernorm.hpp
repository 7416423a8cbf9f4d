#pragma once
// kfa layernorm forward|backward: kfa::layer_norm and its backward on HDF5 files or a random
// problem (layernorm.cpp).

#include <kfa/layer_norm.hpp>

#include <string>
#include <vector>

#include "cli.hpp"

namespace kfa_cli {

/// What `kfa layernorm` takes besides the shared run options.
struct LayerNormOptions {
  kfa::LayerNormParams params;
  std::vector<long long> random;  ///< --random ROWS,D
};

/// The usage text of `kfa layernorm`.
extern const char* const kLayerNormUsage;

/// Parses `kfa layernorm forward|backward [flags]` (argv[1] is "layernorm") into o (command
/// "forward" or "backward") and ln; throws kfa_apps::InputError naming the flag.
void parse_layer_norm(int argc, char** argv, kfa_apps::RunOptions& o, LayerNormOptions& ln);

/// Runs the pass; returns the exit status (1 when --check finds the rule broken).
int run_layer_norm(kfa_apps::RunOptions o, const LayerNormOptions& ln);

}  // namespace kfa_cli
