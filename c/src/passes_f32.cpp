// The C interface's passes in float (see passes.hpp).
#include "passes_impl.hpp"

template struct kfa::c_api::Passes<float>;
