/* The decode graph's attention over an int8 KV cache, for softknn.generate.kernel (compiled at first use with
   the machine's C compiler; ONNX Runtime's GroupQueryAttention is the reference it is tested against).

   For each row b of Tb = tlen[b] new tokens (T where tlen is NULL; a row's tokens past Tb are padding, not
   read or written), query token t < Tb and kv head h, with the row's past length p = seqlens[b] + 1 - Tb:
     1. the new key and value of token t are written at column p + t as round(x * (1 / scale)) (ties to even)
        clipped to -128..127, as GroupQueryAttention writes them (softknn.generate.batch.quantize_kv, which
        writes the memory, divides and clips to +-127: the odd half rounds the other way);
     2. for each of the G = H / KV query heads of h, over columns j <= p + t:
          s_j = (q . K_j) + bias[b, t, j]     (K_j = the column's integers times the key scales, folded into q)
          out = softmax_j(s) . V_j            (V_j = integers times the value scales, applied once at the end)
     3. where `attn` is given, the last token's probabilities summed over the heads, times attn_w, are added to
        attn[b, j] (the evidence trace: the mean over heads and memory layers).
   One pass per (row, token, kv head): the G heads share each key and value column as it is read; leading
   columns a token may not see (bias -inf: a prefix row facing the memory) are not read. Plain C loops that
   gcc -O3 -march=native vectorises, and for SmolLM2's shape (3 heads a kv head, 64 dims) on a CPU with
   AVX-512 the same loops in intrinsics (scores_g3_d64, values_g3_d64; -DSOFTKNN_GENERIC keeps the plain
   ones, which the tests run too). Each block is asked for 4 KB ahead of its reads. exp is a polynomial
   (Cody-Waite reduction, Cephes' degree-6 polynomial, within 2 ulp of expf), so the softmax vectorises
   without libmvec or -ffast-math, which would assume no infinities (the bias holds -inf where a row may
   not look). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if (defined(__F16C__) || defined(__AVX512F__)) && !defined(SOFTKNN_GENERIC)
#include <immintrin.h>
#endif

/* bytes ahead of the column being read that are asked for: the rows' blocks are read once a step, from
   memory, and the hardware prefetcher alone left a 16-row step at 32 ms against 23 with this
   (bench/attention_kernel.py, 4 KB best of 0.5-8) */
#define PREFETCH 4096

static inline float exp_neg(float x) { /* exp(x) for x <= 0; 0 below -87 (and for -inf) */
  const float xc = x < -87.f ? -87.f : x;
  const float n = rintf(xc * 1.44269504088896341f);
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  union { int32_t i; float f; } two;
  two.i = ((int32_t)n + 127) << 23;
  return x < -87.f ? 0.f : p * two.f;
}

static inline int8_t quantize(float x, float inv_s) {
  float r = rintf(x * inv_s);
  r = r > 127.f ? 127.f : (r < -128.f ? -128.f : r);
  return (int8_t)r;
}

/* P[g * S + j] = qs_g . K_j + bias[j] for the G heads over columns lo <= j < n; m[g] their maximum */
static void scores(const float* qs, const int8_t* Kb, const float* bt, int lo, int n, int S, int G, int D, float* P,
                   float* m) {
  float kf[256];
  for (int g = 0; g < G; g++) m[g] = -INFINITY;
  for (int j = lo; j < n; j++) {
    const int8_t* kc = Kb + (size_t)j * D;
    __builtin_prefetch(kc + PREFETCH); /* never faults: past the row's columns it reads nothing used */
    for (int d = 0; d < D; d++) kf[d] = (float)kc[d];
    for (int g = 0; g < G; g++) {
      float s = 0.f;
      for (int d = 0; d < D; d++) s += qs[g * D + d] * kf[d];
      s += bt[j];
      P[(size_t)g * S + j] = s;
      m[g] = s > m[g] ? s : m[g];
    }
  }
}

/* acc[g * D + d] = sum_j P[g * S + j] V_j[d] over columns lo <= j < n */
static void values(const int8_t* Vb, const float* P, int lo, int n, int S, int G, int D, float* acc) {
  float vf[256];
  if (G == 3 && D == 64) { /* SmolLM2's shape without AVX-512: 3 x 64 accumulators the compiler keeps in registers */
    float a0[64] = {0}, a1[64] = {0}, a2[64] = {0};
    for (int j = lo; j < n; j++) {
      const int8_t* vc = Vb + (size_t)j * 64;
      __builtin_prefetch(vc + PREFETCH);
      const float p0 = P[j], p1 = P[(size_t)S + j], p2 = P[2 * (size_t)S + j];
      for (int d = 0; d < 64; d++) {
        const float v = (float)vc[d];
        a0[d] += p0 * v;
        a1[d] += p1 * v;
        a2[d] += p2 * v;
      }
    }
    for (int d = 0; d < 64; d++) {
      acc[d] = a0[d];
      acc[64 + d] = a1[d];
      acc[128 + d] = a2[d];
    }
    return;
  }
  memset(acc, 0, sizeof(float) * (size_t)G * D);
  for (int j = lo; j < n; j++) {
    const int8_t* vc = Vb + (size_t)j * D;
    __builtin_prefetch(vc + PREFETCH);
    for (int d = 0; d < D; d++) vf[d] = (float)vc[d];
    for (int g = 0; g < G; g++) {
      const float pg = P[(size_t)g * S + j];
      for (int d = 0; d < D; d++) acc[g * D + d] += pg * vf[d];
    }
  }
}

#if defined(__AVX512F__) && !defined(SOFTKNN_GENERIC)
#define SOFTKNN_AVX512 1
#include <immintrin.h>
/* SmolLM2's shape (3 query heads a kv head, 64 dims) in AVX-512: the 3 queries in 12 registers, 4 columns
   at a time, each column's 64 codes widened once for the 3 heads; the 12 dot products' lanes summed 4
   columns at once (reduce4) instead of one horizontal sum a column and head. */
static inline __m512 widen16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

static inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) { /* (sum a0, sum a1, sum a2, sum a3) */
  const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512d xd = _mm512_castps_pd(x), yd = _mm512_castps_pd(y);
  __m512 z = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(xd, yd)), _mm512_castpd_ps(_mm512_unpackhi_pd(xd, yd)));
  z = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, 0x4E));
  z = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, 0xB1));
  return _mm512_castps512_ps128(z);
}

static void scores_g3_d64(const float* qs, const int8_t* Kb, const float* bt, int lo, int n, int S, float* P,
                          float* m) {
  __m512 q[3][4];
  for (int g = 0; g < 3; g++)
    for (int i = 0; i < 4; i++) q[g][i] = _mm512_loadu_ps(qs + g * 64 + 16 * i);
  __m128 mx[3] = {_mm_set1_ps(-INFINITY), _mm_set1_ps(-INFINITY), _mm_set1_ps(-INFINITY)};
  int j = lo;
  for (; j + 4 <= n; j += 4) {
    __m512 a[3][4];
    for (int c = 0; c < 4; c++) {
      const int8_t* kc = Kb + (size_t)(j + c) * 64;
      _mm_prefetch((const char*)(kc + PREFETCH), _MM_HINT_T0);
      const __m512 k0 = widen16(kc), k1 = widen16(kc + 16), k2 = widen16(kc + 32), k3 = widen16(kc + 48);
      for (int g = 0; g < 3; g++)
        a[g][c] = _mm512_fmadd_ps(q[g][3], k3, _mm512_fmadd_ps(q[g][2], k2, _mm512_fmadd_ps(q[g][1], k1,
                                                                                          _mm512_mul_ps(q[g][0], k0))));
    }
    const __m128 b4 = _mm_loadu_ps(bt + j);
    for (int g = 0; g < 3; g++) {
      const __m128 s = _mm_add_ps(reduce4(a[g][0], a[g][1], a[g][2], a[g][3]), b4);
      _mm_storeu_ps(P + (size_t)g * S + j, s);
      mx[g] = _mm_max_ps(mx[g], s);
    }
  }
  for (int g = 0; g < 3; g++) {
    float t4[4];
    _mm_storeu_ps(t4, mx[g]);
    m[g] = fmaxf(fmaxf(t4[0], t4[1]), fmaxf(t4[2], t4[3]));
  }
  for (; j < n; j++) { /* the last n - lo mod 4 columns */
    const int8_t* kc = Kb + (size_t)j * 64;
    const __m512 k0 = widen16(kc), k1 = widen16(kc + 16), k2 = widen16(kc + 32), k3 = widen16(kc + 48);
    for (int g = 0; g < 3; g++) {
      const __m512 a = _mm512_fmadd_ps(q[g][3], k3, _mm512_fmadd_ps(q[g][2], k2, _mm512_fmadd_ps(q[g][1], k1,
                                                                                          _mm512_mul_ps(q[g][0], k0))));
      const float s = _mm512_reduce_add_ps(a) + bt[j];
      P[(size_t)g * S + j] = s;
      m[g] = s > m[g] ? s : m[g];
    }
  }
}

static void values_g3_d64(const int8_t* Vb, const float* P, int lo, int n, int S, float* acc) {
  __m512 a[3][4];
  for (int g = 0; g < 3; g++)
    for (int i = 0; i < 4; i++) a[g][i] = _mm512_setzero_ps();
  for (int j = lo; j < n; j++) {
    const int8_t* vc = Vb + (size_t)j * 64;
    _mm_prefetch((const char*)(vc + PREFETCH), _MM_HINT_T0);
    const __m512 v[4] = {widen16(vc), widen16(vc + 16), widen16(vc + 32), widen16(vc + 48)};
    for (int g = 0; g < 3; g++) {
      const __m512 p = _mm512_set1_ps(P[(size_t)g * S + j]);
      for (int i = 0; i < 4; i++) a[g][i] = _mm512_fmadd_ps(p, v[i], a[g][i]);
    }
  }
  for (int g = 0; g < 3; g++)
    for (int i = 0; i < 4; i++) _mm512_storeu_ps(acc + g * 64 + 16 * i, a[g][i]);
}
#endif

/* One call's arguments (softknn_attend's), read by every thread that takes a share of its work. */
typedef struct {
  int B, T, H, KV, C, D, S, G;
  const float *q, *knew, *vnew;
  int8_t *K, *V;
  const float *ks, *vs;
  const int32_t *seqlens, *tlen;
  const float* bias;
  float* out;
  float* tr;     /* (B, KV, S) or NULL: (b, h)'s share of the trace, columns span[2 i] <= j < span[2 i + 1] */
  int32_t* span; /* (B, KV, 2), i = b KV + h */
  const int32_t* work; /* the items: (b, h, t0, t1) each */
  float attn_w;
} Job;

/* Row b's new columns of kv head h (step 1), before any token of the call attends. */
static void write_new(const Job* J, int b, int h) {
  const int T = J->T, KV = J->KV, C = J->C, D = J->D;
  const int Tb = J->tlen ? J->tlen[b] : T;
  const int past = J->seqlens[b] + 1 - Tb;
  const float* ks = J->ks + (size_t)h * D;
  const float* vs = J->vs + (size_t)h * D;
  int8_t* Kb = J->K + ((size_t)b * KV + h) * C * D;
  int8_t* Vb = J->V + ((size_t)b * KV + h) * C * D;
  for (int t = 0; t < Tb; t++) {
    const float* kn = J->knew + ((size_t)b * T + t) * KV * D + (size_t)h * D;
    const float* vn = J->vnew + ((size_t)b * T + t) * KV * D + (size_t)h * D;
    int8_t* kc = Kb + (size_t)(past + t) * D;
    int8_t* vc = Vb + (size_t)(past + t) * D;
    for (int d = 0; d < D; d++) {
      kc[d] = quantize(kn[d], 1.f / ks[d]);
      vc[d] = quantize(vn[d], 1.f / vs[d]);
    }
  }
}

/* Tokens t0 <= t < t1 of row b attended by the G query heads of kv head h (steps 2 and 3). Items touch
   disjoint memory (those tokens' outputs of h's heads, the trace's (b, h) slice for the item holding the
   row's last token) and only read the cache, so any thread may take any item and the result does not
   depend on which did. P: G x S floats of scratch. */
static void item(const Job* J, int b, int h, int t0, int t1, float* P) {
  const int T = J->T, H = J->H, KV = J->KV, C = J->C, D = J->D, S = J->S, G = J->G;
  const int Tb = J->tlen ? J->tlen[b] : T;
  const int past = J->seqlens[b] + 1 - Tb;
  const float* ks = J->ks + (size_t)h * D;
  const float* vs = J->vs + (size_t)h * D;
  const int8_t* Kb = J->K + ((size_t)b * KV + h) * C * D;
  const int8_t* Vb = J->V + ((size_t)b * KV + h) * C * D;
  float qs[16 * 256], acc[16 * 256], m[16], inv[16];
  for (int t = t0; t < t1; t++) {
    const int n = past + t + 1; /* the columns token t sees */
    const float* bt = J->bias + ((size_t)b * T + t) * S;
    int lo = 0; /* leading columns it may not see (a prefix row facing the memory): not read at all */
    while (lo < n - 1 && bt[lo] == -INFINITY) lo++;
    for (int g = 0; g < G; g++) {
      const float* qg = J->q + ((size_t)b * T + t) * H * D + (size_t)(h * G + g) * D;
      for (int d = 0; d < D; d++) qs[g * D + d] = qg[d] * ks[d];
    }
#if SOFTKNN_AVX512
    if (G == 3 && D == 64)
      scores_g3_d64(qs, Kb, bt, lo, n, S, P, m);
    else
#endif
      scores(qs, Kb, bt, lo, n, S, G, D, P, m);
    for (int g = 0; g < G; g++) {
      float* p = P + (size_t)g * S;
      const float mg = m[g];
      float z = 0.f;
      for (int j = lo; j < n; j++) {
        const float e = exp_neg(p[j] - mg);
        p[j] = e;
        z += e;
      }
      inv[g] = 1.f / z;
    }
#if SOFTKNN_AVX512
    if (G == 3 && D == 64)
      values_g3_d64(Vb, P, lo, n, S, acc);
    else
#endif
      values(Vb, P, lo, n, S, G, D, acc);
    for (int g = 0; g < G; g++) {
      float* o = J->out + ((size_t)b * T + t) * H * D + (size_t)(h * G + g) * D;
      for (int d = 0; d < D; d++) o[d] = acc[g * D + d] * inv[g] * vs[d];
    }
    if (J->tr && t == Tb - 1) {
      const size_t i = (size_t)b * KV + h;
      float* a = J->tr + i * S;
      for (int j = lo; j < n; j++) a[j] = 0.f; /* then each head's share, in head order: the same sums as one
                                                   column at a time, in loops that vectorise */
      for (int g = 0; g < G; g++) {
        const float c = inv[g] * J->attn_w;
        const float* pg = P + (size_t)g * S;
        for (int j = lo; j < n; j++) a[j] += pg[j] * c;
      }
      J->span[2 * i] = lo;
      J->span[2 * i + 1] = n;
    }
  }
}

/* The threads that share a call's items: the caller and up to threads - 1 workers, started at the first call
   that asks for them and kept for the process. A call posts its job as a new generation of `ticket`, each
   thread takes items off it by compare-and-swap until none is left, and the caller returns when `done`
   counts them all. The ticket holds the generation (24 bits), the job's item count and the next item (20
   bits each), so a claim of a job already over fails. Workers sleep on the condition variable between
   calls (an idle worker that spun took the core ONNX Runtime's next segment needed: gen_serving's 16
   streams at 27.2 ms a token spinning 0.3 ms, 25.0 not spinning). A call of fewer than MIN_SHARED column
   reads runs on the caller alone: waking a worker costs tens of microseconds, one decode row's whole
   attention at k = 8 (~2,700 column reads) ~40. */
#define MAX_THREADS 64
#define MIN_SHARED 8000
#define TOKENS_AN_ITEM 16 /* a prefill's tokens in blocks, so that one row's prefill is shared too */
static Job g_job;
static int g_threads; /* of the current job: workers 1 .. g_threads - 1 take part */
static _Atomic uint64_t g_ticket;
static _Atomic int g_done;
static int g_workers, g_sleeping;
static long g_shared_calls; /* calls that posted their items to the workers (softknn_shared_calls) */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

#define GEN(t) ((uint32_t)((t) >> 40))
#define ITEMS(t) ((int)(((t) >> 20) & 0xFFFFF))
#define NEXT(t) ((int)((t) & 0xFFFFF))
#define MAX_ITEMS 0xFFFFF

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* take and run items of generation `gen` until none is left; P grows to the job's G x S */
static void take_items(uint32_t gen, float** P, size_t* cap) {
  for (;;) {
    uint64_t t = atomic_load_explicit(&g_ticket, memory_order_acquire);
    if (GEN(t) != gen || NEXT(t) >= ITEMS(t)) return;
    if (!atomic_compare_exchange_weak_explicit(&g_ticket, &t, t + 1, memory_order_acq_rel, memory_order_acquire))
      continue;
    /* a claimed item of the current generation: the caller does not post the next job before it is done */
    const Job* J = &g_job;
    const size_t need = (size_t)J->G * J->S;
    if (need > *cap) {
      float* np = (float*)realloc(*P, sizeof(float) * need);
      if (!np) abort(); /* a few kB; a worker has no caller to hand the failure to */
      *P = np;
      *cap = need;
    }
    const int32_t* w = J->work + 4 * (size_t)NEXT(t);
    item(J, w[0], w[1], w[2], w[3], *P);
    atomic_fetch_add_explicit(&g_done, 1, memory_order_release);
  }
}

static void* worker(void* arg) {
  const int id = (int)(intptr_t)arg; /* 1, 2, ...: the caller is 0 */
  float* P = NULL;
  size_t cap = 0;
  uint32_t seen = GEN(atomic_load(&g_ticket));
  for (;;) {
    uint32_t gen;
    pthread_mutex_lock(&g_mu);
    g_sleeping++;
    while ((gen = GEN(atomic_load(&g_ticket))) == seen) pthread_cond_wait(&g_cv, &g_mu);
    g_sleeping--;
    const int join = id < g_threads;
    pthread_mutex_unlock(&g_mu);
    seen = gen;
    if (join) take_items(gen, &P, &cap);
  }
  return NULL;
}

/* workers up to threads - 1 (fewer where the system refuses one); the threads a call can use */
static int start_workers(int threads) {
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  pthread_mutex_lock(&g_mu);
  while (g_workers + 1 < threads) {
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    const int rc = pthread_create(&th, &at, worker, (void*)(intptr_t)(g_workers + 1));
    pthread_attr_destroy(&at);
    if (rc != 0) break;
    g_workers++;
  }
  const int have = g_workers + 1;
  pthread_mutex_unlock(&g_mu);
  return have < threads ? have : threads;
}

/* q (B, T, H*D) with 1/sqrt(D) folded in, knew/vnew (B, T, KV*D), K/V (B, KV, C, D) int8 updated in place,
   ks/vs (KV*D), seqlens (B), tlen (B) or NULL, bias (B, T, S) with S >= seqlens[b] + 1, out (B, T, H*D)
   (a padding token's rows left as they were); attn (B, S) or NULL; threads: how many threads may share
   the call's work (the caller and threads - 1 workers). A call of more threads is not reentrant: one at a
   time in a process (they keep the GIL: softknn.generate.kernel); a call of one thread touches no shared
   state, and may run beside any other (a decode step's lanes, each on its own thread, the GIL released).
   Returns 0, or -1 when the shape is outside what the stack buffers hold or a row does not fit. */
int softknn_attend(int B, int T, int H, int KV, int C, int D, int S, const float* q, const float* knew,
                   const float* vnew, int8_t* K, int8_t* V, const float* ks, const float* vs, const int32_t* seqlens,
                   const int32_t* tlen, const float* bias, float* out, float* attn, float attn_w, int threads) {
  if (KV <= 0 || H % KV || H / KV > 16 || D > 256 || D <= 0) return -1;
  const int G = H / KV;
  long reads = 0;   /* column reads of the call, to decide whether it is worth sharing */
  size_t items = 0; /* (b, h, tokens) items: a row's tokens in blocks of TOKENS_AN_ITEM */
  for (int b = 0; b < B; b++) {
    const int Tb = tlen ? tlen[b] : T;
    if (seqlens[b] + 1 > S || seqlens[b] + 1 > C || (tlen && (tlen[b] < 1 || tlen[b] > T)) || seqlens[b] + 1 < Tb)
      return -1;
    reads += (long)Tb * (seqlens[b] + 1) * KV;
    items += (size_t)KV * ((Tb + TOKENS_AN_ITEM - 1) / TOKENS_AN_ITEM);
  }
  const size_t pairs = (size_t)B * KV;
  float* P = (float*)malloc(sizeof(float) * (size_t)G * (size_t)S);
  int32_t* work = (int32_t*)malloc(sizeof(int32_t) * 4 * items);
  float* tr = attn ? (float*)malloc(sizeof(float) * pairs * (size_t)S) : NULL;
  int32_t* span = attn ? (int32_t*)malloc(sizeof(int32_t) * 2 * pairs) : NULL;
  if (!P || !work || (attn && (!tr || !span))) {
    free(P);
    free(work);
    free(tr);
    free(span);
    return -1;
  }
  size_t n = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < KV; h++) {
      const int Tb = tlen ? tlen[b] : T;
      for (int t0 = 0; t0 < Tb; t0 += TOKENS_AN_ITEM) {
        int32_t* w = work + 4 * n++;
        w[0] = b;
        w[1] = h;
        w[2] = t0;
        w[3] = t0 + TOKENS_AN_ITEM < Tb ? t0 + TOKENS_AN_ITEM : Tb;
      }
    }
  const Job J = {B, T, H, KV, C, D, S, G, q, knew, vnew, K, V, ks, vs, seqlens, tlen, bias, out, tr, span, work, attn_w};
  for (int b = 0; b < B; b++) /* step 1, before any token attends */
    for (int h = 0; h < KV; h++) write_new(&J, b, h);
  if (threads > 1 && reads >= MIN_SHARED && items > 1 && items <= MAX_ITEMS) threads = start_workers(threads);
  if (threads <= 1 || reads < MIN_SHARED || items < 2 || items > MAX_ITEMS) {
    for (size_t i = 0; i < items; i++) item(&J, work[4 * i], work[4 * i + 1], work[4 * i + 2], work[4 * i + 3], P);
  } else {
    g_job = J;
    g_shared_calls++;
    atomic_store_explicit(&g_done, 0, memory_order_relaxed);
    pthread_mutex_lock(&g_mu); /* posted under the lock: a worker reads g_threads and sleeps under it */
    g_threads = threads;
    const uint32_t gen = (GEN(atomic_load(&g_ticket)) + 1) & 0xFFFFFF;
    atomic_store_explicit(&g_ticket, (uint64_t)gen << 40 | (uint64_t)items << 20, memory_order_release);
    if (g_sleeping) pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    size_t cap = (size_t)G * S;
    take_items(gen, &P, &cap);
    while (atomic_load_explicit(&g_done, memory_order_acquire) < (int)items) cpu_relax();
  }
  if (attn) /* the trace: each row's kv heads in order, the same sums whichever thread ran them */
    for (size_t i = 0; i < pairs; i++) {
      float* a = attn + (i / KV) * S;
      const float* s = tr + i * S;
      for (int j = span[2 * i]; j < span[2 * i + 1]; j++) a[j] += s[j];
    }
  free(P);
  free(work);
  free(tr);
  free(span);
  return 0;
}

/* How many calls so far shared their work with the workers (the tests check that large ones do). */
long softknn_shared_calls(void) { return g_shared_calls; }

/* One chunk of R's memory laid out as a row of the int8 cache holds it (softknn.generate.batch.KVCache.layout,
   the numpy reference it is tested against to the bit): kv (n, L, 2, KV, D) float32, the chunk's keys and
   values at the memory layers; scales (L, 2, KV, D) those layers' cache scales; keys/values (L, KV, M, D)
   int8, written at columns o .. o + n - 1 as x / scale rounded to the nearest integer (ties to even) and
   clipped to +-127 (batch.quantize_kv). Touches no shared state: the caller may release the GIL. */
void softknn_layout(int n, int L, int KV, int D, int M, int o, const float* kv, const float* scales, int8_t* keys,
                    int8_t* values) {
  for (int t = 0; t < n; t++)
    for (int l = 0; l < L; l++)
      for (int s = 0; s < 2; s++)
        for (int h = 0; h < KV; h++) {
          const size_t i = (((size_t)l * 2 + s) * KV + h) * D;
          const float* x = kv + (size_t)t * L * 2 * KV * D + i;
          const float* sc = scales + i;
          int8_t* dst = (s ? values : keys) + (((size_t)l * KV + h) * M + o + t) * D;
          for (int d = 0; d < D; d++) {
            float r = rintf(x[d] / sc[d]);
            r = r > 127.f ? 127.f : (r < -127.f ? -127.f : r);
            dst[d] = (int8_t)r;
          }
        }
}

/* The same from a float16 store (softknn.generate.memory, kind fp16): kv (n, L, 2, KV, D) as float16 bits,
   each widened to float32 exactly (F16C where the CPU has it, else the bits moved by hand), then as
   softknn_layout. One pass over the stored bytes instead of a float32 copy of the chunk (4 bytes a value
   written and read again) and then this. */
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t bits;
  if (e == 0) {
    const float f = (float)m * 0x1p-24f; /* zero or subnormal: m * 2^-24, exact in float32 */
    return sign ? -f : f;
  }
  bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112u) << 23) | (m << 13);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static void widen_half(const uint16_t* h, float* f, int D) {
  int d = 0;
#if defined(__F16C__) && !defined(SOFTKNN_GENERIC)
  for (; d + 8 <= D; d += 8) _mm256_storeu_ps(f + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + d))));
#endif
  for (; d < D; d++) f[d] = half_to_float(h[d]);
}

static inline void quantize_row(const float* x, const float* sc, int8_t* dst, int D) {
  for (int d = 0; d < D; d++) {
    float r = rintf(x[d] / sc[d]);
    r = r > 127.f ? 127.f : (r < -127.f ? -127.f : r);
    dst[d] = (int8_t)r;
  }
}

void softknn_layout_f16(int n, int L, int KV, int D, int M, int o, const uint16_t* kv, const float* scales,
                        int8_t* keys, int8_t* values) {
  float* x = malloc(sizeof(float) * (size_t)D);
  if (!x) return;
  for (int t = 0; t < n; t++)
    for (int l = 0; l < L; l++)
      for (int s = 0; s < 2; s++)
        for (int h = 0; h < KV; h++) {
          const size_t i = (((size_t)l * 2 + s) * KV + h) * D;
          widen_half(kv + (size_t)t * L * 2 * KV * D + i, x, D);
          quantize_row(x, scales + i, (s ? values : keys) + (((size_t)l * KV + h) * M + o + t) * D, D);
        }
  free(x);
}

/* The same from a q4 or q2 store (kinds q4, q2): codes (n, L, 2, KV, D * bits / 8), code d of a row in bits
   (d % per) * bits of byte d / per (per = 8 / bits, low first); k_range (L, KV, D, 2) float16, (step, min) of
   each key channel over the chunk; v_range (n, L, KV, 2) float16, (step, min) of each value vector. A value
   is code * step + min in float32, the product rounded before the sum as numpy's decode_chunk computes it
   (no fused multiply-add: the pragma below), then as softknn_layout. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
void softknn_layout_q(int n, int L, int KV, int D, int M, int o, int bits, const uint8_t* codes,
                      const uint16_t* k_range, const uint16_t* v_range, const float* scales, int8_t* keys,
                      int8_t* values) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const int per = 8 / bits, row = D / per;
  const unsigned mask = (1u << bits) - 1u;
  float* kr = malloc(sizeof(float) * (size_t)L * KV * D * 2);
  float* q = malloc(sizeof(float) * (size_t)D);
  float* x = malloc(sizeof(float) * (size_t)D);
  if (!kr || !q || !x) {
    free(kr), free(q), free(x);
    return;
  }
  for (size_t i = 0; i < (size_t)L * KV * D * 2; i++) kr[i] = half_to_float(k_range[i]);
  for (int t = 0; t < n; t++)
    for (int l = 0; l < L; l++)
      for (int s = 0; s < 2; s++)
        for (int h = 0; h < KV; h++) {
          const uint8_t* c = codes + ((((size_t)t * L + l) * 2 + s) * KV + h) * row;
          if (bits == 4)
            for (int j = 0; j < row; j++) q[2 * j] = (float)(c[j] & 15u), q[2 * j + 1] = (float)(c[j] >> 4);
          else
            for (int j = 0; j < row; j++)
              for (int u = 0; u < per; u++) q[j * per + u] = (float)((c[j] >> (u * bits)) & mask);
          if (s == 0) {
            const float* r = kr + ((size_t)l * KV + h) * D * 2;
            for (int d = 0; d < D; d++) {
              const float p = q[d] * r[2 * d];
              x[d] = p + r[2 * d + 1];
            }
          } else {
            const uint16_t* vr = v_range + (((size_t)t * L + l) * KV + h) * 2;
            const float step = half_to_float(vr[0]), lo = half_to_float(vr[1]);
            for (int d = 0; d < D; d++) {
              const float p = q[d] * step;
              x[d] = p + lo;
            }
          }
          const size_t i = (((size_t)l * 2 + s) * KV + h) * D;
          quantize_row(x, scales + i, (s ? values : keys) + (((size_t)l * KV + h) * M + o + t) * D, D);
        }
  free(kr), free(q), free(x);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
