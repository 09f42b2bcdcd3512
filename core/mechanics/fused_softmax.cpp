// One block of attention rows, from q.k to the unnormalised softmax, in two passes over each row.
//
// Built and loaded by core/fused_softmax.py (g++ -O3 -march=native, plain C ABI through ctypes, no
// torch headers: compiles in well under a second). Why a kernel: torch runs the chain bias add,
// divide by tau, mask, row max, subtract, clamp, exp, row sum, sum(exp * shifted) as separate
// passes over a block that lives in L3 at best; here each row (32 KiB at 8,192 keys) is read
// twice while it sits in L1/L2, and T5's relative bias is read from its one vector per head
// (core/relative_bias.py) in place: row i's bias is the window starting at start - i.
//
// Per row r of the block (b, h, i), with s = q.k (float32, in S), bias row B(h, i), tau t:
//   x_j = (s_j + B_j) / t,   x_j = -FLT_MAX where key j is masked (as finfo.min in torch's path)
//   m   = max_j x_j
//   d_j = x_j - m,  e_j = exp(d_j) (0 where d_j < -87: below float32's normal range; torch's
//                   path clamps there too), written over S
//   total_r = sum_j e_j,  dot_r = sum_j e_j * d_j
// so Pmax = 1 / total and H = log(total) - dot / total (core.probes), and the output is
// (e @ v) / total. NaN or infinite logits give NaN totals, as torch's path does: the probes
// count them.
//
// A decoder's causal prefill (diag >= 0): the caller multiplies only the keys the block's last
// row sees (S holds start + r1 keys for rows [r0, r1)), and row i of the block reads and computes
// keys 0 .. diag + i only, writing exp 0 past them: the diagonal is masked here, with no mask
// tensor, and no key past a row's place is ever read (keys there may hold anything, NaN included).

#include <cfloat>
#include <cstdint>
#include <cstring>

// The vector width is the widest the target has: GCC lowers a generic vector wider than the target's
// registers piece by piece, and some operations (the selects, the int conversion) element by element: a
// 64-byte vector built for AVX2 ran the kernel 9x slower than this one (issue 49: 151 ms against 17 ms
// per 16 M scores on the same machine).
#if defined(__AVX512F__)
#define AAE_VBYTES 64
#elif defined(__AVX__)
#define AAE_VBYTES 32
#else
#define AAE_VBYTES 16
#endif
typedef float vf __attribute__((vector_size(AAE_VBYTES)));
typedef int32_t vi __attribute__((vector_size(AAE_VBYTES)));
static const int W = AAE_VBYTES / 4;
typedef uint8_t vb __attribute__((vector_size(AAE_VBYTES / 4)));  // W mask bytes

static inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
static inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
static inline vf splat(float x) { return vf{} + x; }

static const float EXP_FLOOR = -87.0f;

// exp for d in [-87, 0] (and NaN -> NaN): Cephes' expf, round-to-nearest range reduction.
static inline vf vexp(vf x) {
    const vf log2e = splat(1.44269504088896341f), magic = splat(12582912.0f);
    vf n = (x * log2e + magic) - magic;  // nearest integer, |n| <= 126
    vf r = x - n * splat(0.693359375f);
    r = r + n * splat(2.12194440e-4f);
    vf z = r * r;
    vf y = splat(1.9875691500e-4f);
    y = y * r + splat(1.3981999507e-3f);
    y = y * r + splat(8.3334519073e-3f);
    y = y * r + splat(4.1665795894e-2f);
    y = y * r + splat(1.6666665459e-1f);
    y = y * r + splat(5.0000001201e-1f);
    y = y * z + r + splat(1.0f);
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return y * (vf)e;
}

static inline float sexp(float x) {
    vf v = splat(x);
    return vexp(v)[0];
}

extern "C" {

// The vector instructions this build uses (what -march chose), for `python -m core doctor`.
const char* aae_isa() {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__)
    return "avx2";
#elif defined(__AVX__)
    return "avx";
#elif defined(__ARM_FEATURE_SVE)
    return "sve";
#elif defined(__ARM_NEON)
    return "neon";
#elif defined(__SSE2__)
    return "sse2";
#else
    return "scalar";
#endif
}

// rows [row_lo, row_hi) of the block S [B, H, c, K] (row r at S + r * lds, K contiguous values).
// E: where exp goes (row r at E + r * lde; E may be S with lde = lds: in place); its values past K in a row are
// never touched (a caller laying rows of K keys into longer rows keeps the rest zero).
// diag: < 0 for no causal mask, else row i of the block sees keys j <= diag + i only: the others are neither read
// nor computed, exp there is written 0 (a causal block's diagonal; the keys past the block's last row are not in S).
// bias: NULL, or float32 with row (h, i) at bias + h * bias_hs + i * bias_rs + bias_base (keys contiguous).
// tau: NULL, or per head (tau_mode 1, [H]) or per block row (tau_mode 2, [c]).
// keymask: NULL, or [B, K] bytes, nonzero = attend.
void aae_softmax_rows(const float* S, int64_t lds, float* E, int64_t lde, int64_t B, int64_t H, int64_t c,
                      int64_t K, int64_t diag, const float* bias, int64_t bias_hs, int64_t bias_rs,
                      int64_t bias_base, const float* tau, int32_t tau_mode, const uint8_t* keymask,
                      int64_t row_lo, int64_t row_hi, float* total, float* dot) {
    const vf neg = splat(-FLT_MAX), floor_ = splat(EXP_FLOOR), zero = splat(0.0f);
    (void)B;
    for (int64_t r = row_lo; r < row_hi; ++r) {
        const int64_t b = r / (H * c), h = (r / c) % H, i = r % c;
        const float* src = S + r * lds;
        float* s = E + r * lde;
        // the keys this row sees: all K, or up to its place on the causal diagonal
        int64_t n = K;
        if (diag >= 0 && diag + i + 1 < K) n = diag + i + 1 > 0 ? diag + i + 1 : 0;
        const int64_t Kv = n - n % W;
        const float* br = bias ? bias + h * bias_hs + i * bias_rs + bias_base : nullptr;
        const uint8_t* km = keymask ? keymask + b * K : nullptr;
        const float t = tau_mode == 1 ? tau[h] : tau_mode == 2 ? tau[i] : 1.0f;
        const bool divide = tau_mode != 0;
        const vf tv = splat(t);
        // pass 1: x = (s + bias) / tau, masked -> -FLT_MAX, written to E; the row max
        vf vm = neg;
        float m = -FLT_MAX;
        int64_t j = 0;
        for (; j < Kv; j += W) {
            vf x = load(src + j);
            if (br) x = x + load(br + j);
            if (divide) x = x / tv;
            if (km) {
                vb bytes;
                std::memcpy(&bytes, km + j, sizeof bytes);
                const vi keep = __builtin_convertvector(bytes, vi) != 0;
                x = keep ? x : neg;
            }
            store(s + j, x);
            vm = x > vm ? x : vm;
        }
        for (int k = 0; k < W; ++k) m = vm[k] > m ? vm[k] : m;
        for (; j < n; ++j) {
            float x = src[j];
            if (br) x += br[j];
            if (divide) x /= t;
            if (km && !km[j]) x = -FLT_MAX;
            s[j] = x;
            m = x > m ? x : m;
        }
        // pass 2: e = exp(x - m) over E, its sum and sum(e * d)
        const vf mv = splat(m);
        vf vt = zero, vd = zero;
        for (j = 0; j < Kv; j += W) {
            vf d = load(s + j) - mv;
            vf e = vexp(d < floor_ ? floor_ : d);
            e = d < floor_ ? zero : e;
            store(s + j, e);
            vt += e;
            vd += e * (d < floor_ ? zero : d);
        }
        float T = 0.0f, D = 0.0f;
        for (int k = 0; k < W; ++k) { T += vt[k]; D += vd[k]; }
        for (; j < n; ++j) {
            float d = s[j] - m;
            float e = d < EXP_FLOOR ? 0.0f : sexp(d);
            s[j] = e;
            T += e;
            D += d < EXP_FLOOR ? 0.0f : e * d;
        }
        if (n < K) std::memset(s + n, 0, (K - n) * sizeof(float));  // the keys past the diagonal: weight 0
        total[r] = T;
        dot[r] = D;
    }
}

// The head mean (head < 0) or one head of rows [0, rows) of item 0's probabilities, keys [0, n0)
// pooled into the bins [edges[b], edges[b + 1]): each bin's sum and max. E is [H, rows, K] exp
// (row stride K), inv_total [H, rows] = 1 / row sums. temp: rows' scratch of n0 floats.
// Why here: the map and the question's rows pool every row of a block; torch normalised the
// block (a pass), averaged the heads (a pass) and pooled with index_add_ and scatter_reduce_
// (scattered writes): here one read of each probability, the pooling from a row in L1/L2.
void aae_pool_rows(const float* E, int64_t H, int64_t K, int64_t n0, const float* inv_total, int64_t rows_all,
                   int32_t head, const int64_t* edges, int64_t nb, int64_t row_lo, int64_t row_hi,
                   float* temp, float* out_sum, float* out_max) {
    const int64_t nv = n0 - n0 % W;
    for (int64_t r = row_lo; r < row_hi; ++r) {
        const float* p;
        if (head >= 0) {
            const float w = inv_total[head * rows_all + r];
            const float* e = E + (head * rows_all + r) * K;
            int64_t j = 0;
            for (; j < nv; j += W) store(temp + j, load(e + j) * splat(w));
            for (; j < n0; ++j) temp[j] = e[j] * w;
        } else {
            for (int64_t h = 0; h < H; ++h) {
                const float w = inv_total[h * rows_all + r] / (float)H;
                const float* e = E + (h * rows_all + r) * K;
                const vf wv = splat(w);
                int64_t j = 0;
                if (h == 0) {
                    for (; j < nv; j += W) store(temp + j, load(e + j) * wv);
                    for (; j < n0; ++j) temp[j] = e[j] * w;
                } else {
                    for (; j < nv; j += W) store(temp + j, load(temp + j) + load(e + j) * wv);
                    for (; j < n0; ++j) temp[j] += e[j] * w;
                }
            }
        }
        p = temp;
        float* os = out_sum + r * nb;
        float* om = out_max + r * nb;
        for (int64_t b = 0; b < nb; ++b) {
            float s = 0.0f, m = 0.0f;
            for (int64_t j = edges[b]; j < edges[b + 1]; ++j) {
                s += p[j];
                m = p[j] > m ? p[j] : m;
            }
            os[b] = s;
            om[b] = m;
        }
    }
}

// Sort each of rows [row_lo, row_hi) (row r at X + r * stride, n values) descending and add it to
// acc (n doubles): the sum of sorted rows of the sorted-logits probe. An LSD radix sort on the
// floats' order-preserving bit patterns, 3 passes of 11 bits over a row in L1/L2 (torch.sort
// did 16 M values/s per thread here). keys, tmp: 2 * n uint32 of scratch.
static inline uint32_t order_key(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static inline float from_key(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

void aae_sorted_sum(const float* X, int64_t stride, int64_t n, int64_t row_lo, int64_t row_hi,
                    uint32_t* scratch, double* acc) {
    uint32_t* a = scratch;
    uint32_t* b = scratch + n;
    for (int64_t r = row_lo; r < row_hi; ++r) {
        const float* x = X + r * stride;
        uint32_t c0[2048] = {0}, c1[2048] = {0}, c2[1024] = {0};
        for (int64_t j = 0; j < n; ++j) {
            uint32_t k = order_key(x[j]);
            a[j] = k;
            ++c0[k & 2047u];
            ++c1[(k >> 11) & 2047u];
            ++c2[k >> 22];
        }
        uint32_t s0 = 0, s1 = 0, s2 = 0;
        for (int i = 0; i < 2048; ++i) { uint32_t t = c0[i]; c0[i] = s0; s0 += t; t = c1[i]; c1[i] = s1; s1 += t; }
        for (int i = 0; i < 1024; ++i) { uint32_t t = c2[i]; c2[i] = s2; s2 += t; }
        for (int64_t j = 0; j < n; ++j) b[c0[a[j] & 2047u]++] = a[j];
        for (int64_t j = 0; j < n; ++j) a[c1[(b[j] >> 11) & 2047u]++] = b[j];
        for (int64_t j = 0; j < n; ++j) b[c2[a[j] >> 22]++] = a[j];
        for (int64_t j = 0; j < n; ++j) acc[j] += (double)from_key(b[n - 1 - j]);
    }
}

}  // extern "C"
