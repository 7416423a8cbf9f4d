#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
template<int MR, int V, bool PK>
__attribute__((noinline)) void kern(int k,const float*a,int lda,const float*b,int ldb,float*c){
  __m512 acc[MR][V];
#pragma GCC unroll 32
  for(int i=0;i<MR;++i)
#pragma GCC unroll 4
 for(int v=0;v<V;++v) acc[i][v]=_mm512_setzero_ps();
  for(int p=0;p<k;++p){ __m512 bv[V]; const float* bp=b+p*ldb;
#pragma GCC unroll 4
    for(int v=0;v<V;++v) bv[v]=_mm512_loadu_ps(bp+16*v);
#pragma GCC unroll 32
    for(int i=0;i<MR;++i){ __m512 ai=_mm512_set1_ps(PK? a[p*MR+i] : a[i*lda+p]);
#pragma GCC unroll 4
      for(int v=0;v<V;++v) acc[i][v]=_mm512_fmadd_ps(ai,bv[v],acc[i][v]); }
  }
#pragma GCC unroll 32
  for(int i=0;i<MR;++i)
#pragma GCC unroll 4
 for(int v=0;v<V;++v) _mm512_store_ps(c+i*64+16*v,acc[i][v]);
}
template<int MR,int V,bool PK=false> void run(int K,int ldb=64){
  static float* A=(float*)aligned_alloc(64,4*(32*256+64)); static float* B=(float*)aligned_alloc(64,4*(256*64+64)); static float* C=(float*)aligned_alloc(64,4*(32*64));
  for(int i=0;i<32*256;++i)A[i]=0.5f; for(int i=0;i<256*64;++i)B[i]=0.25f;
  long it=400000000L/(K*MR*V*16); double best=0;
  for(int rep=0;rep<7;++rep){ double t=now();
  for(long r=0;r<it;++r){ kern<MR,V,PK>(K,A,K,B,ldb,C); asm volatile(""::"r"(C):"memory");}
  t=now()-t; double g=it*2.0*MR*V*16*K/t/1e9; if(g>best)best=g;}
  printf("%dx%d PK%d K=%d ldb=%d: best %.1f\n",MR,V,(int)PK,K,ldb,best);
}
int main(){ for(int q=0;q<2;++q){ run<6,4>(64); run<6,4>(64,80); run<6,4>(64,72); run<8,3>(64); run<8,3>(64,48); run<8,3,true>(64); run<8,3>(128); run<6,4>(128);} }
