/* The memory attention of one decode step for bench/attention_kernel.py: int8 keys and values (a scale per
   kv head and channel), grouped query heads, one pass per row and kv head (q.k with the key scales folded into
   q, a softmax with the row's additive bias, p.v with the value scales applied once). Plain C for gcc -O3
   -march=native -ffast-math to vectorise (expf through glibc's libmvec). Not used by the service. */
#include <stdint.h>
#include <math.h>
#include <string.h>
int attn_int8(int B, int H, int KV, int C, int D, int S, const float* q, const int8_t* K, const int8_t* V,
               const float* ks, const float* vs, const float* bias, float* out, float* probs) {
  const int G = H / KV;
  if (G > 16 || D > 128 || H % KV) return -1;  /* the stack buffers below */
  float qs[16 * 128], acc[16 * 128], kf[128], inv[16], m[16];
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < KV; h++) {
      const int8_t* Kb = K + (size_t)(b * KV + h) * C * D;
      const int8_t* Vb = V + (size_t)(b * KV + h) * C * D;
      float* P = probs + ((size_t)b * H + h * G) * S;
      for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        for (int d = 0; d < D; d++) qs[g * D + d] = q[((size_t)b * H + h * G + g) * D + d] * ks[h * D + d];
      }
      for (int c = 0; c < S; c++) {
        const int8_t* kc = Kb + (size_t)c * D;
        for (int d = 0; d < D; d++) kf[d] = (float)kc[d];
        const float bb = bias[(size_t)b * S + c];
        for (int g = 0; g < G; g++) {
          float s = 0.f;
          for (int d = 0; d < D; d++) s += qs[g * D + d] * kf[d];
          s += bb;
          P[(size_t)g * S + c] = s;
          m[g] = s > m[g] ? s : m[g];
        }
      }
      for (int g = 0; g < G; g++) {
        float* p = P + (size_t)g * S;
        const float mg = m[g];
        float z = 0.f;
        for (int c = 0; c < S; c++) { float e = expf(p[c] - mg); p[c] = e; z += e; }
        inv[g] = 1.f / z;
      }
      if (G == 3 && D == 64) {  /* SmolLM2's shape: 3 x 64 accumulators, kept in registers */
        float a0[64] = {0}, a1[64] = {0}, a2[64] = {0};
        for (int c = 0; c < S; c++) {
          const int8_t* vc = Vb + (size_t)c * 64;
          const float p0 = P[c], p1 = P[(size_t)S + c], p2 = P[2 * (size_t)S + c];
          for (int d = 0; d < 64; d++) {
            const float v = (float)vc[d];
            a0[d] += p0 * v;
            a1[d] += p1 * v;
            a2[d] += p2 * v;
          }
        }
        for (int d = 0; d < 64; d++) { acc[d] = a0[d]; acc[64 + d] = a1[d]; acc[128 + d] = a2[d]; }
      } else {
        memset(acc, 0, sizeof(float) * G * D);
        for (int c = 0; c < S; c++) {
          const int8_t* vc = Vb + (size_t)c * D;
          for (int d = 0; d < D; d++) kf[d] = (float)vc[d];
          for (int g = 0; g < G; g++) {
            const float pg = P[(size_t)g * S + c];
            for (int d = 0; d < D; d++) acc[g * D + d] += pg * kf[d];
          }
        }
      }
      for (int g = 0; g < G; g++) {
        for (int d = 0; d < D; d++) out[((size_t)b * H + h * G + g) * D + d] = acc[g * D + d] * inv[g] * vs[h * D + d];
        float* p = P + (size_t)g * S;
        for (int c = 0; c < S; c++) p[c] *= inv[g];
      }
    }
  }
  return 0;
}
