// The C interface's passes in double (see passes.hpp).
#include "passes_impl.hpp"

template struct kfa::c_api::Passes<double>;
