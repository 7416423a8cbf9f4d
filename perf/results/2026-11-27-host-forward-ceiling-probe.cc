#include <immintrin.h>
#include <chrono>
#include <cstdio>
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
alignas(64) float buf[4096];
template<int NL, int NB>
double run(){ __m512 a[24]; for(int i=0;i<24;++i)a[i]=_mm512_set1_ps(i*1e-3f);
 long it=5000000; double t=now();
 const float* p=buf;
 for(long r=0;r<it;++r){
   __m512 b[4]; for(int v=0;v<4;++v) b[v]= v<NL? _mm512_load_ps(p+16*v) : _mm512_set1_ps(0.5f+v);
   asm volatile("":"+r"(p));
#pragma GCC unroll 6
   for(int i=0;i<6;++i){ __m512 x = i<NB? _mm512_set1_ps(p[64+i]) : _mm512_set1_ps(0.25f);
#pragma GCC unroll 4
     for(int v=0;v<4;++v) a[i*4+v]=_mm512_fmadd_ps(x,b[v],a[i*4+v]); }
   asm volatile("":"+r"(p));
 }
 t=now()-t; float s=0; for(int i=0;i<24;++i) s+=a[i][0]; if(s==1.2345f) puts("x"); return it*24.0*32/t/1e9;}
int main(){ for(int rep=0;rep<2;++rep){ printf("no loads %.1f\n",run<0,0>()); printf("4 loads %.1f\n",run<4,0>()); printf("6 bcast %.1f\n",run<0,6>()); printf("4+6 %.1f\n",run<4,6>());} }
