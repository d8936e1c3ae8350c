// Asynchronous greedy coordinate descent for the bias-free kernel SVM dual (seed 001, Alg 14).
//
//   min_a 1/2 a'Qa - e'a   s.t. 0 <= a_i <= C_i,   Q_ij = y_i y_j K(x_i, x_j)     (eq. 4.9)
//
// One persistent thread block per worker. Block w owns the variables [starts[w], starts[w+1])
// (the host reorders the data so that blocks are contiguous) and repeats, never waiting for
// another block:
//   1. block-wide argmax of the projected gradient (eq. 4.11) over its variables, reading the
//      shared gradient g straight from L2 (volatile: L1 is not coherent between SMs);
//      selection "random" picks a uniform variable instead (PSCD) and scans only once per
//      |block| picks, to check convergence;
//   2. thread 0 computes the closed-form step delta (eq. 4.10);
//   3. every thread adds delta * Q_ji into g[j] with atomicAdd for its share of j, the kernel
//      value computed on the fly from X (stored feature-major, so neighbouring threads read
//      neighbouring addresses) or read from a precomputed Q when the host could afford one;
//   4. thread 0 writes a_i.
// Stopping is the CPU solver's protocol (gpuml/kernels/_cpu/gcd.py): counters[STARTED] is
// bumped before step 3, counters[FINISHED] after step 4, fenced; a block whose scan saw no
// projected gradient >= tol while FINISHED == STARTED == s and STARTED still s afterwards
// certifies state s in quiet[w]; when all blocks certified the same s, counters[STOP] is set.
// All blocks must be resident at once (the host caps the grid at what the GPU holds), since
// a certified block spins until the others agree.

#define GCD_THREADS 256

enum { GCD_STARTED = 0, GCD_FINISHED = 1, GCD_STOP = 2 };
enum { KERNEL_LINEAR = 0, KERNEL_POLY = 1, KERNEL_RBF = 2, KERNEL_SIGMOID = 3 };
enum { ACTION_UPDATE = 0, ACTION_SKIP = 1, ACTION_STOP = 2 };

__device__ __forceinline__ unsigned long long gcd_load_counter(unsigned long long* p) {
    return atomicAdd(p, 0ULL);
}

template <typename T>
__device__ __forceinline__ T gcd_volatile_load(const T* p) {
    return *reinterpret_cast<const volatile T*>(p);
}

template <typename T>
__device__ __forceinline__ T gcd_projected_gradient(T g, T a, T c) {
    T moved = a - g;
    moved = moved < T(0) ? T(0) : (moved > c ? c : moved);
    T pg = a - moved;
    return pg < T(0) ? -pg : pg;
}

template <typename T>
__device__ __forceinline__ T gcd_kernel(const T* XT, const T* sq_norms, long long n, int d,
                                        long long i, long long j, int kind, T gamma, T coef0,
                                        int degree) {
    T dot = T(0);
    for (int k = 0; k < d; ++k) {
        dot += XT[(long long)k * n + i] * XT[(long long)k * n + j];
    }
    if (kind == KERNEL_LINEAR) return dot;
    if (kind == KERNEL_POLY) {
        T base = gamma * dot + coef0;
        T out = T(1);
        for (int p = 0; p < degree; ++p) out *= base;
        return out;
    }
    if (kind == KERNEL_RBF) {
        T d2 = sq_norms[i] + sq_norms[j] - T(2) * dot;
        return exp(-gamma * (d2 > T(0) ? d2 : T(0)));
    }
    return tanh(gamma * dot + coef0);
}

// Block-wide argmax of the projected gradient over [lo, hi); the result is valid in thread 0.
template <typename T>
__device__ void gcd_block_argmax(const T* g, const T* alpha, const T* C, long long lo,
                                 long long hi, T* s_val, long long* s_idx) {
    T best_v = T(0);
    long long best = -1;
    for (long long j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        T v = gcd_projected_gradient(gcd_volatile_load(g + j), gcd_volatile_load(alpha + j),
                                     C[j]);
        if (v > best_v) {
            best_v = v;
            best = j;
        }
    }
    s_val[threadIdx.x] = best_v;
    s_idx[threadIdx.x] = best;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            T other = s_val[threadIdx.x + stride];
            if (other > s_val[threadIdx.x]) {
                s_val[threadIdx.x] = other;
                s_idx[threadIdx.x] = s_idx[threadIdx.x + stride];
            }
        }
        __syncthreads();
    }
}

template <typename T>
__global__ void __launch_bounds__(GCD_THREADS)
gcd_solve(const T* __restrict__ XT, const T* __restrict__ sq_norms, const T* __restrict__ Q,
          int use_q, const T* __restrict__ y, const T* __restrict__ C,
          const T* __restrict__ qdiag, const long long* __restrict__ starts, long long n, int d,
          int kind, T gamma, T coef0, int degree, int greedy, T tol,
          unsigned long long max_updates, unsigned long long seed, T* alpha, T* g,
          unsigned long long* counters, unsigned long long* quiet, int n_workers) {
    __shared__ T s_val[GCD_THREADS];
    __shared__ long long s_idx[GCD_THREADS];
    __shared__ int s_action;
    __shared__ long long s_i;
    __shared__ T s_delta;
    __shared__ int s_scan;

    const int w = blockIdx.x;
    const long long lo = starts[w];
    const long long hi = starts[w + 1];
    const long long size = hi - lo;
    unsigned long long rng = seed ^ (0x9E3779B97F4A7C15ULL * (unsigned long long)(w + 1));
    if (rng == 0ULL) rng = 1ULL;
    long long picks = 0;

    for (;;) {
        // Nobody may still be reading last round's shared decision when thread 0 writes anew.
        __syncthreads();
        unsigned long long seen_started = 0ULL;
        bool consistent = false;
        if (threadIdx.x == 0) {
            s_action = gcd_load_counter(counters + GCD_STOP) != 0ULL ? ACTION_STOP
                                                                     : ACTION_UPDATE;
            if (!greedy && ++picks >= size) picks = 0;
            s_scan = greedy || picks == 0;
            // FINISHED first: FINISHED <= STARTED always, so equal reads mean nothing in flight.
            unsigned long long finished = gcd_load_counter(counters + GCD_FINISHED);
            seen_started = gcd_load_counter(counters + GCD_STARTED);
            consistent = finished == seen_started;
            __threadfence();
        }
        __syncthreads();
        if (s_action == ACTION_STOP) break;

        bool random_pick = !greedy;
        if (s_scan) {
            gcd_block_argmax(g, alpha, C, lo, hi, s_val, s_idx);
            if (threadIdx.x == 0) {
                if (s_val[0] < tol || s_idx[0] < 0) {
                    s_action = ACTION_SKIP;
                    random_pick = false;
                    if (consistent && gcd_load_counter(counters + GCD_STARTED) == seen_started) {
                        atomicExch(quiet + w, seen_started);
                        bool all = true;
                        for (int v = 0; v < n_workers && all; ++v) {
                            all = atomicAdd(quiet + v, 0ULL) == seen_started;
                        }
                        if (all && gcd_load_counter(counters + GCD_STARTED) == seen_started) {
                            atomicExch(counters + GCD_STOP, 1ULL);
                        }
                    }
                } else if (greedy) {
                    s_i = s_idx[0];
                }
            }
        }
        if (threadIdx.x == 0 && random_pick) {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            s_i = lo + (long long)((rng * 2685821657736338717ULL) % (unsigned long long)size);
        }
        if (threadIdx.x == 0 && s_action == ACTION_UPDATE) {
            long long i = s_i;
            T a_i = gcd_volatile_load(alpha + i);
            T moved = a_i - gcd_volatile_load(g + i) / qdiag[i];
            moved = moved < T(0) ? T(0) : (moved > C[i] ? C[i] : moved);
            s_delta = moved - a_i;
            if (s_delta == T(0)) {
                s_action = ACTION_SKIP;
            } else if (atomicAdd(counters + GCD_STARTED, 1ULL) >= max_updates) {
                atomicExch(counters + GCD_STOP, 1ULL);
                s_action = ACTION_STOP;
            }
        }
        __syncthreads();
        if (s_action == ACTION_STOP) break;
        if (s_action == ACTION_SKIP) continue;

        const long long i = s_i;
        const T delta = s_delta;
        const T y_i = y[i];
        for (long long j = threadIdx.x; j < n; j += blockDim.x) {
            T k_ij = use_q ? Q[i * n + j]
                           : y_i * y[j] * gcd_kernel(XT, sq_norms, n, d, i, j, kind, gamma,
                                                     coef0, degree);
            atomicAdd(g + j, delta * k_ij);
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            *reinterpret_cast<volatile T*>(alpha + i) = alpha[i] + delta;
            __threadfence();
            atomicAdd(counters + GCD_FINISHED, 1ULL);
        }
        __syncthreads();
    }
}

#ifdef GPUML_NVCC_CHECK
template __global__ void gcd_solve<float>(const float*, const float*, const float*, int,
                                          const float*, const float*, const float*,
                                          const long long*, long long, int, int, float, float,
                                          int, int, float, unsigned long long,
                                          unsigned long long, float*, float*,
                                          unsigned long long*, unsigned long long*, int);
template __global__ void gcd_solve<double>(const double*, const double*, const double*, int,
                                           const double*, const double*, const double*,
                                           const long long*, long long, int, int, double,
                                           double, int, int, double, unsigned long long,
                                           unsigned long long, double*, double*,
                                           unsigned long long*, unsigned long long*, int);
#endif
