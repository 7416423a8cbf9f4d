#pragma once
/// \file impl/mpi/ring.hpp
/// Mode::ring. K/V shards travel around the ring (rank r sends to r + 1) in P - 1 steps; the
/// send and receive of the next shard are posted before the current one is computed, so
/// communication can overlap compute (not measured yet). Each rank merges the partials of its
/// queries locally. Blocks that the masks hide entirely are skipped (causal: shards after the
/// rank's rows). The backward sends the dK/dV accumulators along with K/V; they come home after
/// the last step; dQ stays local.

#include <kfa/impl/mpi/blocks.hpp>
#include <kfa/impl/mpi/check.hpp>
#include <kfa/impl/mpi/comm.hpp>
#include <kfa/params.hpp>
#include <kfa/seqpar.hpp>

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace kfa::mpi::impl {

/// The [K, V] shards travelling the ring, double-buffered: at step s this rank holds the shard
/// of rank (rank - s) mod P, and the shard of step s + 1 arrives while step s computes.
/// Messages of step s carry tag 2s; odd tags are left to the backward's accumulators. A pair
/// buffer holds K (B, H, rows, D) then V (B, H, rows, Dv): v's head dim may differ from k's.
/// Every buffer is pooled (kfa::impl::Temporary, held until the Shards ends): no allocation and
/// no page faults in steady state.
template <class T, class ExecSpace>
class Shards {
 public:
  using Mem = typename ExecSpace::memory_space;
  using tensor = typename Flat<T, Mem>::tensor;

  template <class K, class V>
  Shards(const ExecSpace& space, const K& k, const V& v, const SeqPar& sp, int rank, int nranks)
      : space_(space),
        sp_(sp),
        rank_(rank),
        P_(nranks),
        B_(k.extent(0)),
        H_(k.extent(1)),
        D_(k.extent(3)),
        Dv_(v.extent(3)),
        capacity_(B_ * H_ * std::size_t(max_count(sp.layout, sp.seqlen_k, nranks)) * (D_ + Dv_)),
        kv_{buffer(), buffer()} {
    Kokkos::deep_copy(space, first(kv_[0], 0), k);
    Kokkos::deep_copy(space, second(kv_[0], 0), v);
  }

  int next() const { return (rank_ + 1) % P_; }
  int prev() const { return (rank_ - 1 + P_) % P_; }
  /// The rank whose keys this rank holds at step s.
  int source(int s) const { return ((rank_ - s) % P_ + P_) % P_; }
  /// Their global rows, in stored order.
  std::vector<Segment> rows(int s) const {
    return owned_rows(sp_.layout, sp_.seqlen_k, source(s), P_);
  }
  /// Values in a [K, V] pair of step s's shard.
  std::size_t size(int s) const { return B_ * H_ * std::size_t(count(s)) * (D_ + Dv_); }

  /// A buffer that holds a pair of any shard's size ([K, V] or [dK, dV]), not initialised.
  Flat<T, Mem> buffer() {
    held_.push_back(std::make_unique<Temp<Kokkos::View<T*, Mem>, ExecSpace>>(space_, capacity_));
    return {held_.back()->view()};
  }
  /// The halves of a pair buffer holding step s's shard (K or dK, V or dV), and the pair's
  /// values as one (B, H, rows, D + Dv) tensor, for elementwise work on both.
  tensor first(const Flat<T, Mem>& f, int s) const { return f.at(0, B_, H_, count(s), D_); }
  tensor second(const Flat<T, Mem>& f, int s) const {
    return f.at(B_ * H_ * std::size_t(count(s)) * D_, B_, H_, count(s), Dv_);
  }
  tensor both(const Flat<T, Mem>& f, int s) const { return f.at(0, B_, H_, count(s), D_ + Dv_); }

  tensor keys(int s) const { return first(kv_[s % 2], s); }
  tensor values(int s) const { return second(kv_[s % 2], s); }

  /// Posts the exchange that brings step s + 1's shard (after `space` is done with its buffer).
  template <class Space>
  void post(const Space& space, int s) {
    if (s + 1 >= P_) return;
    space.fence();
    ch_.irecv(kv_[(s + 1) % 2].data, size(s + 1), prev(), 2 * s, sp_.comm, &req_[0]);
    ch_.isend(kv_[s % 2].data, size(s), next(), 2 * s, sp_.comm, &req_[1]);
  }
  /// Completes the exchange post(space, s) started.
  template <class Space>
  void wait(const Space& space, int s) {
    if (s + 1 >= P_) return;
    wait_all(space, sp_, 2, req_);
    ch_.finish_recv(kv_[(s + 1) % 2].data, size(s + 1));
  }

 private:
  long long count(int s) const { return owned_count(sp_.layout, sp_.seqlen_k, source(s), P_); }

  ExecSpace space_;
  const SeqPar& sp_;
  int rank_, P_;
  std::size_t B_, H_, D_, Dv_, capacity_;
  std::vector<std::unique_ptr<Temp<Kokkos::View<T*, Mem>, ExecSpace>>> held_;  // before kv_
  Flat<T, Mem> kv_[2];
  Channel<T, Mem> ch_;
  MPI_Request req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

/// Mode::ring (see the file comment); the interface every mode has: largest_message, for the
/// collective check, then the passes after it.
struct Ring {
  /// Values in the largest message: a [K, V] (or [dK, dV]) pair of the largest shard.
  static double largest_message(const SeqPar& sp, int nranks, const Call& c) {
    return double(c.batch) * c.heads_k * double(max_count(sp.layout, sp.seqlen_k, nranks)) *
           double(c.head_dim + c.head_dim_v);
  }

  /// The running result (o, lse or rsum) of this rank's queries starts empty (rule R's
  /// identity); each visible block of the shard at hand merges into it by R's join.
  template <class R, class ExecSpace, class Q, class K, class V, class O, class Lse>
  static void forward(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o,
                      const Lse& lse, const R& rule, const SeqPar& sp, int rank, int P) {
    using T = typename Q::non_const_value_type;
    using Mem = typename ExecSpace::memory_space;
    clear_result<R>(space, o, lse);
    Shards<T, ExecSpace> kv(space, k, v, sp, rank, P);
    // Pooled (kfa::impl::Temporary); each block's forward writes its rows before the merge.
    const Temp<Tensor<T, Mem>, ExecSpace> ob_t(space, q.extent(0), q.extent(1), q.extent(2),
                                               o.extent(3));
    const Temp<Rows<T, Mem>, ExecSpace> lb_t(space, q.extent(0), q.extent(1), q.extent(2));
    const auto& ob = ob_t.view();
    const auto& lb = lb_t.view();
    const std::vector<Segment> qrows = owned_rows(sp.layout, sp.seqlen_q, rank, P);
    for (int s = 0; s < P; ++s) {
      kv.post(space, s);
      for_each_block(rule.masks(), sp, qrows, kv.rows(s), [&](const Block& b) {
        forward_block(space, rule, b, q, kv.keys(s), kv.values(s), ob, lb, o, lse);
      });
      kv.wait(space, s);
    }
  }

  /// K/V shards travel as in the forward; each carries the dK/dV accumulator of its keys, which
  /// the next rank receives while computing its own block (the block's gradients go into a
  /// zeroed buffer and the incoming accumulator is added afterwards), so that message overlaps
  /// compute too. After the last step each accumulator is one hop from home. dq (zeroed by the
  /// caller) gathers the blocks of every step locally.
  template <class R, class ExecSpace, class Q, class K, class V, class DO, class Lse, class Delta,
            class DQ, class DK, class DV>
  static void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const DO& dout,
                       const Lse& lse, const Delta& delta, const DQ& dq, const DK& dk, const DV& dv,
                       const R& rule, const SeqPar& sp, int rank, int P) {
    using T = typename Q::non_const_value_type;
    using Mem = typename ExecSpace::memory_space;
    Shards<T, ExecSpace> kv(space, k, v, sp, rank, P);
    // [dK, dV] of this step's block (two: the previous one may still be in flight), and the
    // accumulator coming in.
    const Flat<T, Mem> acc[2] = {kv.buffer(), kv.buffer()};
    const Flat<T, Mem> incoming = kv.buffer();
    Channel<T, Mem> ch;
    MPI_Request sent = MPI_REQUEST_NULL;
    const std::vector<Segment> qrows = owned_rows(sp.layout, sp.seqlen_q, rank, P);
    for (int s = 0; s < P; ++s) {
      kv.post(space, s);
      // The accumulator of this step's shard, which the previous rank finished at step s - 1.
      MPI_Request arriving = MPI_REQUEST_NULL;
      if (s > 0) ch.irecv(incoming.data, kv.size(s), kv.prev(), 2 * s - 1, sp.comm, &arriving);
      const Flat<T, Mem>& mine = acc[s % 2];
      clear(space, kv.both(mine, s));
      for_each_block(rule.masks(), sp, qrows, kv.rows(s), [&](const Block& b) {
        backward_block(space, rule, b, q, kv.keys(s), kv.values(s), dout, lse, delta, dq,
                       kv.first(mine, s), kv.second(mine, s));
      });
      if (s > 0) {
        wait_all(space, sp, 1, &arriving);
        ch.finish_recv(incoming.data, kv.size(s));
        add_into(space, kv.both(mine, s), kv.both(incoming, s));
      }
      space.fence();
      // One accumulator send in flight at a time, so the buffer written next step is free.
      wait_all(space, sp, 1, &sent);
      ch.isend(mine.data, kv.size(s), kv.next(), 2 * s + 1, sp.comm, &sent);
      kv.wait(space, s);
    }
    // The last step sent every accumulator home: this rank's comes from the previous rank.
    MPI_Request last[2] = {MPI_REQUEST_NULL, sent};
    ch.irecv(incoming.data, kv.size(0), kv.prev(), 2 * P - 1, sp.comm, &last[0]);
    wait_all(space, sp, 2, last);
    ch.finish_recv(incoming.data, kv.size(0));
    Kokkos::deep_copy(space, dk, kv.first(incoming, 0));
    Kokkos::deep_copy(space, dv, kv.second(incoming, 0));
  }
};

}  // namespace kfa::mpi::impl
