// What a thread pays, right after it wakes from a sleep, to run code it ran before, against the
// same code right after a busy wait of the same length (scripts/gpu/wake-cost.sh:
// why eight processes' alloc+free pairs cost the limiter twice what one process's do).
// Each case runs 16 calls or 16 lines of code and is timed with the TSC; medians and p10..p90.
// Built and run by wake-cost.sh.
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>
static uint64_t now_ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
static int cmp(const void*a,const void*b){uint64_t x=*(uint64_t*)a,y=*(uint64_t*)b;return x<y?-1:x>y;}
static void pr(const char*n,uint64_t*v,int reps){qsort(v,reps,8,cmp);printf("  %-44s %6lu (%lu..%lu)\n",n,v[reps/2],v[reps/10],v[reps*9/10]);}
__attribute__((noinline, aligned(4096))) uint64_t p0(uint64_t x){ x=x*3+0; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p1(uint64_t x){ x=x*3+1; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p2(uint64_t x){ x=x*3+2; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p3(uint64_t x){ x=x*3+3; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p4(uint64_t x){ x=x*3+4; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p5(uint64_t x){ x=x*3+5; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p6(uint64_t x){ x=x*3+6; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p7(uint64_t x){ x=x*3+7; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p8(uint64_t x){ x=x*3+8; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p9(uint64_t x){ x=x*3+9; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p10(uint64_t x){ x=x*3+10; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p11(uint64_t x){ x=x*3+11; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p12(uint64_t x){ x=x*3+12; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p13(uint64_t x){ x=x*3+13; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p14(uint64_t x){ x=x*3+14; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(4096))) uint64_t p15(uint64_t x){ x=x*3+15; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l0(uint64_t x){ x=x*3+0; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l1(uint64_t x){ x=x*3+1; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l2(uint64_t x){ x=x*3+2; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l3(uint64_t x){ x=x*3+3; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l4(uint64_t x){ x=x*3+4; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l5(uint64_t x){ x=x*3+5; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l6(uint64_t x){ x=x*3+6; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l7(uint64_t x){ x=x*3+7; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l8(uint64_t x){ x=x*3+8; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l9(uint64_t x){ x=x*3+9; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l10(uint64_t x){ x=x*3+10; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l11(uint64_t x){ x=x*3+11; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l12(uint64_t x){ x=x*3+12; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l13(uint64_t x){ x=x*3+13; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l14(uint64_t x){ x=x*3+14; __asm__ volatile(""::"r"(x)); return x; }
__attribute__((noinline, aligned(64))) uint64_t l15(uint64_t x){ x=x*3+15; __asm__ volatile(""::"r"(x)); return x; }
typedef uint64_t (*fn)(uint64_t);
static fn pp[] = {p0,p1,p2,p3,p4,p5,p6,p7,p8,p9,p10,p11,p12,p13,p14,p15};
static fn ll[] = {l0,l1,l2,l3,l4,l5,l6,l7,l8,l9,l10,l11,l12,l13,l14,l15};
__attribute__((noinline)) static uint64_t ind_pages(uint64_t x){for(int k=0;k<16;k++) x=pp[k](x); return x;}
__attribute__((noinline)) static uint64_t ind_lines(uint64_t x){for(int k=0;k<16;k++) x=ll[k](x); return x;}
__attribute__((noinline)) static uint64_t dir_pages(uint64_t x){x=p0(x);x=p1(x);x=p2(x);x=p3(x);x=p4(x);x=p5(x);x=p6(x);x=p7(x);x=p8(x);x=p9(x);x=p10(x);x=p11(x);x=p12(x);x=p13(x);x=p14(x);x=p15(x); return x;}
__attribute__((noinline)) static uint64_t dir_lines(uint64_t x){x=l0(x);x=l1(x);x=l2(x);x=l3(x);x=l4(x);x=l5(x);x=l6(x);x=l7(x);x=l8(x);x=l9(x);x=l10(x);x=l11(x);x=l12(x);x=l13(x);x=l14(x);x=l15(x); return x;}
__attribute__((noinline, aligned(4096))) static uint64_t straight(uint64_t x){
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    __asm__ volatile(".rept 16\n add $1, %0\n .endr" : "+r"(x));
    return x; }
static uint64_t pages[16*512] __attribute__((aligned(4096)));
/* A dependent walk over 16 data lines, one on each of 16 pages. */
__attribute__((noinline)) static uint64_t data_pages(uint64_t i){for(int k=0;k<16;k++) i=pages[(i&15)*512+(k*8)%512]+k; return i;}
static void busy(int us){uint64_t e=now_ns()+us*1000ull; while(now_ns()<e){}}
int main(int argc,char**argv){
  int reps=argc>1?atoi(argv[1]):2000; int us=argc>2?atoi(argv[2]):400;
  fn tests[]={ind_pages,dir_pages,ind_lines,dir_lines,straight,data_pages};
  const char*names[]={"16 indirect calls, 16 code pages","16 direct calls, 16 code pages","16 indirect calls, 16 lines of 1 page","16 direct calls, 16 lines of 1 page","16 lines of straight code, 1 page","16 data lines on 16 pages"};
  for(int k=0;k<16*512;k++) pages[k]=k*7;
  uint64_t *a=malloc(reps*8*12); uint64_t x=1;
  struct timespec d={0,us*1000};
  for(int r=0;r<reps;r++) for(int t=0;t<6;t++){
    uint64_t t0,t1;
    nanosleep(&d,0); t0=__rdtsc(); x=tests[t](x); t1=__rdtsc(); a[(2*t)*reps+r]=t1-t0;
    busy(us);        t0=__rdtsc(); x=tests[t](x); t1=__rdtsc(); a[(2*t+1)*reps+r]=t1-t0;
  }
  printf("%d us waits, %d reps, TSC ticks, after sleep | after busy wait:\n", us, reps);
  for(int t=0;t<6;t++){ char b[128]; snprintf(b,128,"%s, sleep",names[t]); pr(b,a+2*t*reps,reps); snprintf(b,128,"%s, busy",names[t]); pr(b,a+(2*t+1)*reps,reps);}
  printf("[%lu]\n",x&1);
  return 0;}
