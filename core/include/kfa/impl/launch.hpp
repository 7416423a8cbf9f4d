#pragma once
/// \file impl/launch.hpp
/// What the team kernels of every pass share: their types for a value type on an execution
/// space, their team scratch, and their launch, which checks on the host what the space
/// cannot run (too many teams, too much scratch, a team size or vector length above its
/// maximum) and throws kfa::Error for it instead of failing inside Kokkos.

#include <kfa/backends/traits.hpp>
#include <kfa/impl/validate.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace kfa::impl {

/// Base of the team kernels on ExecSpace for value type T: the types they use and the
/// scratch and launch code they share.
template <class ExecSpace, class T>
struct TeamKernel {
  using acc_t = backends::accum_t<T>;
  using traits = backends::TileTraits<ExecSpace, T>;
  using ops = backends::TileOps<ExecSpace, T>;
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;
  using member_t = typename policy_t::member_type;
  using scratch_view =
      Kokkos::View<acc_t*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

  /// Tile shape of a kernel, for the messages of a launch it cannot make.
  struct Shape {
    int head_dim, rows, cols;
  };

  /// Team scratch taken by arrays of acc_t of these lengths, carved in this order (each
  /// carve rounds up to the scratch alignment, which shmem_size counts).
  static std::size_t scratch_bytes(std::initializer_list<std::size_t> lengths) {
    std::size_t bytes = 0;
    for (std::size_t n : lengths)
      bytes += scratch_view::shmem_size(n);
    return bytes;
  }

  /// The scratch level for `bytes` per team: 0, the fast one, when they fit there, else 1.
  static int scratch_level(std::size_t bytes) {
    return bytes > static_cast<std::size_t>(policy_t::scratch_size_max(0)) ? 1 : 0;
  }

  /// The next n elements of a team's scratch `scr` (team.team_scratch(level)).
  KOKKOS_INLINE_FUNCTION static acc_t* carve(const typename ExecSpace::scratch_memory_space& scr,
                                             std::size_t n) {
    return scratch_view(scr, n).data();
  }

  /// Stages `rows` rows of `cols` contiguous elements into a scratch tile, by the whole team:
  /// dst[r * ld + c] = f(src_row(r)[c]), where src_row(r) points at row r of a view (rows of
  /// head_dim have unit stride, validate.hpp). One call per array: with two arrays' stores in
  /// one loop the host compiler did not vectorise it, and the copies cost a third of the
  /// forward's time at head_dim 64.
  template <class Member, class Row, class F>
  KOKKOS_INLINE_FUNCTION static void stage_rows(const Member& team, int rows, int cols,
                                                const Row& src_row, acc_t* dst, int ld,
                                                const F& f) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
      const auto* src = src_row(r);
      acc_t* row = dst + static_cast<std::ptrdiff_t>(r) * ld;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, cols),
                           [&](int c) { row[c] = f(src[c]); });
    });
  }

  /// Whether every row of a rank-4 view starts on 16 bytes (unit stride inside a row is
  /// checked by validation): the register-resident kernels copy 16-bit rows in 16-byte pieces
  /// and add float dQ four columns at a time.
  template <class View>
  static bool rows_on_16_bytes(const View& x) {
    constexpr std::size_t size = sizeof(typename View::value_type);
    return reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0 && x.stride(0) * size % 16 == 0 &&
           x.stride(1) * size % 16 == 0 && x.stride(2) * size % 16 == 0;
  }

  /// Runs `kernel` (named `label`) over `league` teams of traits::team_size threads (AUTO
  /// where it is 0) and traits::vector_length lanes with `bytes` of scratch at `level`.
  /// Throws kfa::Error for `pass`, naming the tile shape, when the space cannot.
  template <class Kernel>
  static void launch(const ExecSpace& space, const char* pass, const char* label,
                     const Kernel& kernel, long long league, std::size_t bytes, int level,
                     const Shape& shape) {
    if (league == 0) return;
    if (league > 2147483647LL)
      fail(pass, label, " needs ", league, " teams (head_dim = ", shape.head_dim, ", tiles of ",
           shape.rows, " x ", shape.cols, "), more than the league size limit (2147483647)");
    const std::size_t max_bytes = static_cast<std::size_t>(policy_t::scratch_size_max(level));
    if (bytes > max_bytes)
      fail(pass, "head_dim = ", shape.head_dim, " needs ", bytes,
           " bytes of team scratch (tiles of ", shape.rows, " x ", shape.cols,
           "), more than this execution space offers (", max_bytes, ")");
    const int vl = traits::vector_length, vl_max = policy_t::vector_length_max();
    if (vl > vl_max)
      fail(pass, "tile traits ask for vector_length = ", vl,
           " but this execution space allows at most ", vl_max);
    // The limit is read from an AUTO policy: Kokkos aborts the process while constructing a
    // policy whose team size it cannot give, before any check of ours could throw.
    policy_t policy(space, static_cast<int>(league), Kokkos::AUTO, vl);
    policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
    const int team_max = policy.team_size_max(kernel, Kokkos::ParallelForTag());
    if (traits::team_size > team_max)
      fail(pass, "tile traits ask for team_size = ", traits::team_size,
           " but this execution space allows at most ", team_max, " for ", label,
           " at head_dim = ", shape.head_dim);
    if (traits::team_size > 0) {
      policy = policy_t(space, static_cast<int>(league), traits::team_size, vl);
      policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
    }
    Kokkos::parallel_for(label, policy, kernel);
  }
};

}  // namespace kfa::impl
