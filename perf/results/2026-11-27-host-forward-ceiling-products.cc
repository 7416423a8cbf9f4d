#include <Kokkos_Core.hpp>
#include <kfa/backends/host/tile.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
using namespace kfa::backends;
using Ops = TileOps<Kokkos::Serial, float>;
static int KC=64;
template<class T> void gemm(T& team,int m,int n,int k,const float*a,int ars,int acs,const float*b,int ldb,float*c,int ldc,bool acc){
  for(int kk=0;kk<k;kk+=KC){int kn=k-kk<KC?k-kk:KC; Ops::gemm(team,m,n,kn,a+(long)kk*acs,ars,acs,b+(long)kk*ldb,ldb,c,ldc,acc||kk>0);} }
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
int main(int argc,char**argv){
  Kokkos::initialize(argc, argv);
  { int D=argc>1?atoi(argv[1]):64, Bc=argc>2?atoi(argv[2]):128, ldq=argc>3?atoi(argv[3]):64, Br=64; KC=argc>4?atoi(argv[4]):1<<20;
  auto al=[](size_t n,float v){float*p=(float*)aligned_alloc(64,((n*4+63)/64)*64); for(size_t i=0;i<n;++i)p[i]=v; return p;};
  size_t NT=argc>5?atoi(argv[5]):1; float *K0=al(NT*Bc*D+64,0.01f),*V0=al(NT*Bc*D+64,0.01f),*Q=al(D*ldq+64,0.02f),*S=al(Bc*ldq+64,0),*O=al(Br*D+64,0);
  int dummy=0; auto& team=dummy;
  double bs=0,bp=0; for(int rep=0;rep<7;++rep){
    long it=2000000000L/(4L*Bc*Br*D); double ts=0,tp=0;
    for(long r=0;r<it;++r){ const float* K=K0+(r%NT)*Bc*D; const float* V=V0+(r%NT)*Bc*D; double t0=now();
      gemm(team, Bc, Br, D, K, D, 1, Q, ldq, S, ldq, false); double t1=now();
      gemm(team, Br, D, Bc, S, 1, ldq, V, D, O, D, true); double t2=now();
      ts+=t1-t0; tp+=t2-t1; }
    double f=2.0*Bc*Br*D*it; bs=std::max(bs,f/ts/1e9); bp=std::max(bp,f/tp/1e9);} { printf("NT=%zu KC=%d D=%d Bc=%d ldq=%d: S %.1f  PV %.1f GFLOP/s\n",NT,KC,D,Bc,ldq,bs,bp);
  }}
  Kokkos::finalize();
}
