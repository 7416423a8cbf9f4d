#pragma once
/// \file impl/mpi/check.hpp
/// The collective check every pass makes before its first collective that could hang: each
/// rank validates its own arguments, the ranks agree on the first error (kfa::mpi::agree), then
/// they compare, exactly, every value that must be the same everywhere: the fields of Params
/// the pass reads, SeqPar's agreed fields, the extents that are not split and the value type.

#include <kfa/impl/bias.hpp>
#include <kfa/impl/mpi/comm.hpp>
#include <kfa/impl/validate.hpp>
#include <kfa/masks.hpp>
#include <kfa/params.hpp>
#include <kfa/seqpar.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kfa::mpi::impl {

/// A pass's score term (kfa/masks.hpp) as the ranks compare it: its kind, the extents of a
/// bias or boolean mask along batch and heads (1 where it broadcasts; the others are checked
/// against values the ranks compare), and whether dbias is computed, which adds a collective.
struct TermShape {
  const char* kind = "none";  // at most 8 characters
  long long batch = 0, heads = 0;
  bool gradient = false;
};
inline TermShape term_shape(const kfa::impl::NoTerm&, bool) {
  return {};
}
template <class S>
TermShape term_shape(const masks::Alibi<S>&, bool) {
  return {"alibi"};
}
template <class B, class D>
TermShape term_shape(const masks::Bias<B, D>& m, bool grad) {
  return {"bias", static_cast<long long>(m.bias.extent(0)),
          static_cast<long long>(m.bias.extent(1)), grad && m.dbias.data() != nullptr};
}
template <class M>
TermShape term_shape(const masks::Dense<M>& m, bool) {
  return {"mask", static_cast<long long>(m.mask.extent(0)),
          static_cast<long long>(m.mask.extent(1))};
}
template <class L>
TermShape term_shape(const masks::KeyPadding<L>&, bool) {
  return {"keypad"};
}

/// A pass as the check sees it: what it reads, and what every rank must call it with besides
/// Params and SeqPar.
struct Call {
  const char* name;  // "mpi::forward", the prefix of its errors
  Passes pass;       // forward or backward: selects the Params fields compared
  long long batch, heads_q, heads_k, head_dim, head_dim_v;  // D of q and k, Dv of v
  bool dlse;                                                // whether dlse was given (backward)
  int value_bits;                                           // 32: float, 64: double
  const char* rule;  // the attention rule's short name (rules.hpp), at most 8 characters
  bool mask;         // whether a mask tensor was given (multi-scale)
  TermShape term{};  // the score term given (softmax), if any
};

template <class T, class Q, class K, class V>
Call call_of(const char* name, Passes pass, const Q& q, const K& k, const V& v, bool dlse,
             const char* rule = "softmax", bool mask = false) {
  return {name,
          pass,
          static_cast<long long>(q.extent(0)),
          static_cast<long long>(q.extent(1)),
          static_cast<long long>(k.extent(1)),
          static_cast<long long>(q.extent(3)),
          static_cast<long long>(v.extent(3)),
          dlse,
          static_cast<int>(8 * sizeof(T)),
          rule,
          mask};
}

/// One value every rank must share: its name in errors, its exact encoding in 64 bits (equal
/// values, equal words) and how to print a word back.
struct Agreed {
  std::string name;
  std::uint64_t word;
  std::string (*show)(std::uint64_t);
};

/// Shortest decimal that reads back as x: exact, and short for the usual values.
inline std::string show_real(std::uint64_t w) {
  double x = 0;
  std::memcpy(&x, &w, sizeof x);
  char buf[32] = {};
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}
inline std::string show_signed(std::uint64_t w) {
  return std::to_string(static_cast<std::int64_t>(w));
}
inline std::string show_unsigned(std::uint64_t w) {
  return std::to_string(w);
}
inline std::string show_bool(std::uint64_t w) {
  return w ? "true" : "false";
}
template <class E>
std::string show_enum(std::uint64_t w) {
  const auto value = static_cast<std::underlying_type_t<E>>(w);
  const std::string name = name_of(static_cast<E>(value));
  return name != "?" ? name : "? (" + std::to_string(value) + ")";
}
inline std::string show_pass(std::uint64_t w) {
  return w == static_cast<std::uint64_t>(Passes::forward)    ? "forward"
         : w == static_cast<std::uint64_t>(Passes::backward) ? "backward"
                                                             : std::to_string(w);
}
/// A short name (up to 8 characters) as one word, and back.
inline std::uint64_t name_word(const char* name) {
  std::uint64_t w = 0;
  std::memcpy(&w, name, std::min<std::size_t>(std::strlen(name), sizeof w));
  return w;
}
inline std::string show_name(std::uint64_t w) {
  char buf[sizeof w + 1] = {};
  std::memcpy(buf, &w, sizeof w);
  return buf;
}
inline std::string show_value_type(std::uint64_t w) {
  return w == 32 ? "float" : w == 64 ? "double" : std::to_string(w) + "-bit";
}

template <class I>
std::uint64_t int_word(I i) {
  if constexpr (std::is_signed_v<I>)
    return static_cast<std::uint64_t>(static_cast<std::int64_t>(i));
  else
    return static_cast<std::uint64_t>(i);
}

/// The exact encoding of a field's value: integers as themselves, doubles by their bits, enums
/// by their underlying value.
template <class V>
Agreed agreed(std::string name, const V& v) {
  if constexpr (std::is_enum_v<V>) {
    return {std::move(name), int_word(static_cast<std::underlying_type_t<V>>(v)), &show_enum<V>};
  } else if constexpr (std::is_same_v<V, bool>) {
    return {std::move(name), v ? 1u : 0u, &show_bool};
  } else if constexpr (std::is_floating_point_v<V>) {
    // -0 becomes +0: the two compare equal and act alike in every field.
    const double x = v == 0 ? 0.0 : static_cast<double>(v);
    std::uint64_t w = 0;
    std::memcpy(&w, &x, sizeof w);
    return {std::move(name), w, &show_real};
  } else {
    static_assert(std::is_integral_v<V> && sizeof(V) <= sizeof(std::uint64_t),
                  "a field compared across ranks is an integer, a floating-point number or an "
                  "enum with EnumNames");
    return {std::move(name), int_word(v), std::is_signed_v<V> ? &show_signed : &show_unsigned};
  }
}

/// Everything the ranks must agree on for `call`, in the same order on every rank.
inline std::vector<Agreed> agreed_values(const Call& call, const Params& p, const SeqPar& sp) {
  // The pass first: ranks calling different passes compare different field lists.
  std::vector<Agreed> out = {{"the pass", int_word(static_cast<int>(call.pass)), &show_pass}};
  // Every field on every rank, so that ranks calling different passes still send lists of one
  // length to the MPI_MAX below (unequal counts were undefined behaviour there); a field the
  // pass does not read is sent as its type's zero, equal on every rank.
  for_each_field(p, [&](const Field& f, const auto& value) {
    using V = std::decay_t<decltype(value)>;
    out.push_back(agreed(std::string("params.") + f.name, reads(f, call.pass) ? value : V{}));
  });
  for_each_agreed_field(sp, [&](const char* name, const auto& value) {
    out.push_back(agreed(std::string("SeqPar::") + name, value));
  });
  out.push_back(agreed("batch", call.batch));
  out.push_back(agreed("heads_q", call.heads_q));
  out.push_back(agreed("heads_k", call.heads_k));
  out.push_back(agreed("head_dim", call.head_dim));
  out.push_back(agreed("v's head_dim", call.head_dim_v));
  out.push_back(agreed("whether dlse is given", call.dlse));
  out.push_back({"the value type", int_word(call.value_bits), &show_value_type});
  out.push_back({"the attention", name_word(call.rule), &show_name});
  out.push_back(agreed("whether a mask is given", call.mask));
  out.push_back({"the score term", name_word(call.term.kind), &show_name});
  out.push_back(agreed("the score term's batch extent", call.term.batch));
  out.push_back(agreed("the score term's heads extent", call.term.heads));
  out.push_back(agreed("whether dbias is given", call.term.gradient));
  return out;
}

/// Compares the words of `mine` across comm: one MPI_MAX over [w, ~w] gives the largest and the
/// smallest of each (min w = ~max ~w). Every rank sees the same extremes, so every rank throws
/// the same error, naming each value that differs.
inline void compare_across_ranks(const char* pass, const std::vector<Agreed>& mine, MPI_Comm comm) {
  const std::size_t n = mine.size();
  std::vector<std::uint64_t> words(2 * n), top(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    words[i] = mine[i].word;
    words[n + i] = ~mine[i].word;
  }
  MPI_Allreduce(words.data(), top.data(), static_cast<int>(2 * n), MPI_UINT64_T, MPI_MAX, comm);
  std::string differ;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t lo = ~top[n + i], hi = top[i];
    if (lo != hi)
      differ += std::string(differ.empty() ? "" : "; ") + mine[i].name +
                " differs between ranks (" + mine[i].show(lo) + " vs " + mine[i].show(hi) + ")";
  }
  if (!differ.empty()) throw CollectiveError(std::string(pass) + ": " + differ);
}

/// The collective check: local_check() on every rank, agreement on the first error, then on
/// the values every rank must share. Every rank of sp.comm throws the same kfa::Error when any
/// fails.
template <class Local>
void check_collectively(const Call& call, const SeqPar& sp, const Params& p,
                        const Local& local_check) {
  if (sp.comm == MPI_COMM_NULL)
    throw Error(std::string(call.name) + ": SeqPar::comm is MPI_COMM_NULL");
  std::string err;
  try {
    local_check();
  } catch (const Error& e) {
    err = e.what();
  } catch (const std::exception& e) {  // e.g. a term's workspace that does not fit: a rank that
    // left here would leave the others waiting in agree()
    err = std::string(call.name) + ": " + e.what();
  }
  const Meter m(sp.timings ? &sp.timings->comm_s : nullptr);
  agree(sp.comm, err);
  compare_across_ranks(call.name, agreed_values(call, p, sp), sp.comm);
}

/// The global sequence lengths must be usable as the kernels' int extents, and the layout and
/// mode values of their enums.
inline void check_seqpar(const char* pass, const SeqPar& sp) {
  if (sp.seqlen_q < 1 || sp.seqlen_k < 1 || sp.seqlen_q > 2147483647LL ||
      sp.seqlen_k > 2147483647LL)
    kfa::impl::fail(pass, "SeqPar seqlen_q = ", sp.seqlen_q, " and seqlen_k = ", sp.seqlen_k,
                    " must be in [1, 2^31)");
  if (std::string_view(name_of(sp.layout)) == "?")
    kfa::impl::fail(pass, "SeqPar::layout = ", static_cast<int>(sp.layout), " is not ",
                    names_of<Layout>());
  if (std::string_view(name_of(sp.mode)) == "?")
    kfa::impl::fail(pass, "SeqPar::mode = ", static_cast<int>(sp.mode), " is not ",
                    names_of<Mode>());
}

/// MPI counts are ints: the largest message of a pass, `values` of T, must fit in one.
inline void check_message_size(const char* pass, const SeqPar& sp, double values) {
  if (values > 2147483647.0)
    kfa::impl::fail(pass, "the ", name_of(sp.mode), " mode needs MPI messages of ", values,
                    " values, more than an MPI count (int) holds; use more ranks or split ",
                    "the batch or heads across calls");
}

/// Local extents must match the layout: `rows` along seqlen for this rank.
template <class View>
void expect_rows(const char* pass, const char* name, const View& v, long long rows,
                 const char* which) {
  if (static_cast<long long>(v.extent(2)) != rows)
    kfa::impl::fail(pass, name, " has seqlen ", v.extent(2),
                    " on this rank but the layout gives it ", rows, " of the ", which, " rows");
}

}  // namespace kfa::mpi::impl
