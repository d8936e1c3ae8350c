// Asynchronous greedy coordinate descent for the bias-free kernel SVM dual
// (You, "Fast and Accurate Machine Learning on Distributed Systems and Supercomputers", 2020,
// ch. 4, Alg 14), for a batch of independent problems (the one-vs-one pairs) in one launch.
//
//   min_a 1/2 a'Qa - e'a   s.t. 0 <= a_i <= C_i,   Q_ij = y_i y_j K(x_i, x_j)     (eq. 4.9)
//
// Layout. The variables of all problems lie end to end; problem p owns
// [problem_vars[p], problem_vars[p+1]) and the thread blocks [problem_blocks[p],
// problem_blocks[p+1]); block b owns the variables [starts[b], starts[b+1]) of problem
// block_problem[b] (the host reorders each problem's data so that its blocks are contiguous).
// Problem p's Q (row-major, n_p x n_p, entries y_i y_j K_ij) starts at Q + problem_q[p], or
// problem_q[p] < 0 and its kernel values are computed on the fly from its rows of X, stored
// feature-major at XT + problem_x[p] (neighbouring threads read neighbouring addresses).
// The data (X, Q) are in T; alpha, g, y, C and the diagonal are double whatever T is, so that
// millions of atomic adds into g do not drift in float32.
//
// One persistent thread block per worker, which repeats, never waiting for another block:
//   1. block-wide argmax of the projected gradient (eq. 4.11) over its variables, reading the
//      shared gradient g straight from L2 (volatile: L1 is not coherent between SMs), passing
//      over variables whose exact step rounds to zero (they cannot move; picking one would
//      stall the block); selection "random" picks a uniform variable instead (PSCD), skips it
//      if its projected gradient is below tol, and scans only once per |block| picks, to
//      check convergence;
//   2. thread 0 computes the damped step (below) from eq. 4.10;
//   3. every thread adds delta * Q_ji into g[j] with atomicAdd for its share of j;
//   4. thread 0 writes a_i.
//
// Damped step (our addition to Alg 14). Blocks run nearly in lockstep, so W blocks take exact
// steps computed from the same gradient at the same time; for strongly correlated coordinates
// (greedy picks the largest violators, which for near-duplicate points share one large
// gradient) the steps add up and overshoot, and the iterates swing between the bounds forever
// (docs/asygcd.md, "Damped steps"). Each block keeps a factor
// eta in [2^-12, 1] and steps P[0,C_i](a_i - eta g_i / Q_ii) - a_i; at its next step it reads
// g again at the coordinate it moved last: a sign change keeping over half the magnitude
// (g_now / g_before < -1/2) means the others' concurrent steps overshot it, and eta halves;
// otherwise eta grows by 10% back to 1. One block never overshoots itself and keeps eta = 1
// (Alg 13). Shorter steps under bounded delay are what the analysis of asynchronous
// coordinate descent asks for (Liu, Wright, Re, Bittorf, Sridhar, "An Asynchronous Parallel
// Stochastic Coordinate Descent Algorithm", 2015). The same rule runs in the CPU solver
// (gpuml/kernels/gcd/cpu.py, damped_step_factor), the oracle of this kernel.
//
// Stopping, per problem (the CPU solver's protocol): its counters[STARTED] is bumped before
// step 3, counters[FINISHED] after step 4, fenced; a block whose scan saw no movable
// projected gradient >= tol while FINISHED == STARTED == s and STARTED still s afterwards
// certifies state s in quiet[b]; when all blocks of the problem certified the same s,
// counters[STOP] = CERTIFIED and its blocks exit. STARTED reaching caps[p] sets
// counters[STOP] = CAPPED: every run ends. A quiet block sleeps (__nanosleep, exponential
// back-off to a few microseconds) before it looks again, leaving L2 to the working blocks.
// All blocks of a launch must be resident at once (the host caps the grid at what the GPU
// holds), since a certified block waits until the other blocks of its problem agree.

#define GCD_THREADS 256
#define GCD_ETA_MIN (1.0 / 4096.0)
#define GCD_ETA_GROWTH 1.1
#define GCD_OVERSHOOT (-0.5)
#define GCD_SLEEP_MIN_NS 32u
#define GCD_SLEEP_MAX_NS 4096u

// counters holds GCD_COUNTERS words per problem.
enum { GCD_STARTED = 0, GCD_FINISHED = 1, GCD_STOP = 2, GCD_COUNTERS = 4 };
enum { GCD_RUNNING = 0, GCD_CERTIFIED = 1, GCD_CAPPED = 2 };
enum { KERNEL_LINEAR = 0, KERNEL_POLY = 1, KERNEL_RBF = 2, KERNEL_SIGMOID = 3 };
enum { ACTION_UPDATE = 0, ACTION_SKIP = 1, ACTION_STOP = 2, ACTION_QUIET = 3 };

// A plain load with acquire semantics at GPU scope: no read-modify-write, so blocks that poll
// a counter do not serialise on it the way atomicAdd(p, 0) does.
__device__ __forceinline__ unsigned long long gcd_load_acquire(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ double gcd_volatile_load(const double* p) {
    return *reinterpret_cast<const volatile double*>(p);
}

__device__ __forceinline__ double gcd_clip(double v, double c) {
    return v < 0.0 ? 0.0 : (v > c ? c : v);
}

__device__ __forceinline__ double gcd_projected_gradient(double g, double a, double c) {
    return fabs(a - gcd_clip(a - g, c));
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

// Block-wide argmax of the projected gradient over the movable variables of [lo, hi); the
// result is valid in thread 0 (index -1: none). The step test runs only for a new maximum.
__device__ void gcd_block_argmax(const double* g, const double* alpha, const double* C,
                                 const double* qdiag, long long lo, long long hi, double* s_val,
                                 long long* s_idx) {
    double best_v = 0.0;
    long long best = -1;
    for (long long j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        double g_j = gcd_volatile_load(g + j);
        double a_j = gcd_volatile_load(alpha + j);
        double v = gcd_projected_gradient(g_j, a_j, C[j]);
        if (v > best_v && gcd_clip(a_j - g_j / qdiag[j], C[j]) != a_j) {
            best_v = v;
            best = j;
        }
    }
    s_val[threadIdx.x] = best_v;
    s_idx[threadIdx.x] = best;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            double other = s_val[threadIdx.x + stride];
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
          const double* __restrict__ y, const double* __restrict__ C,
          const double* __restrict__ qdiag, const long long* __restrict__ starts,
          const int* __restrict__ block_problem, const long long* __restrict__ problem_vars,
          const int* __restrict__ problem_blocks, const long long* __restrict__ problem_q,
          const long long* __restrict__ problem_x, const unsigned long long* __restrict__ caps,
          const unsigned long long* __restrict__ seeds, int d, int kind, T gamma, T coef0,
          int degree, int greedy, double tol, double* alpha, double* g,
          unsigned long long* counters, unsigned long long* quiet) {
    __shared__ double s_val[GCD_THREADS];
    __shared__ long long s_idx[GCD_THREADS];
    __shared__ int s_stop;
    __shared__ int s_action;
    __shared__ long long s_i;
    __shared__ double s_delta;
    __shared__ int s_scan;

    const int b = blockIdx.x;
    const int p = block_problem[b];
    const long long lo = starts[b];
    const long long hi = starts[b + 1];
    const long long size = hi - lo;
    const long long base = problem_vars[p];
    const long long n = problem_vars[p + 1] - base;
    const int first_block = problem_blocks[p];
    const int last_block = problem_blocks[p + 1];
    const bool use_q = problem_q[p] >= 0;
    const T* Qp = Q + (use_q ? problem_q[p] : 0);
    const T* XTp = XT + problem_x[p];
    const T* sq_p = sq_norms + base;
    const double* y_p = y + base;
    double* g_p = g + base;
    unsigned long long* cnt = counters + (long long)GCD_COUNTERS * p;
    const unsigned long long cap = caps[p];

    // Thread 0's own state: the random generator, the damped step, the back-off.
    unsigned long long rng =
        seeds[p] ^ (0x9E3779B97F4A7C15ULL * (unsigned long long)(b - first_block + 1));
    if (rng == 0ULL) rng = 1ULL;
    long long picks = 0;
    double eta = 1.0;
    long long last_i = -1;
    double last_g = 0.0;
    unsigned int sleep_ns = GCD_SLEEP_MIN_NS;

    for (;;) {
        // Nobody may still be reading last round's shared decision when thread 0 writes anew.
        __syncthreads();
        unsigned long long seen_started = 0ULL;
        bool consistent = false;
        if (threadIdx.x == 0) {
            // s_stop is read by every thread right after the barrier below and not written
            // again before the next round; s_action may change (thread 0 alone, below) before
            // slower warps get there, so they read it only after the round's last barrier.
            s_stop = gcd_load_acquire(cnt + GCD_STOP) != GCD_RUNNING;
            s_action = ACTION_UPDATE;
            if (!greedy && ++picks >= size) picks = 0;
            s_scan = greedy || picks == 0;
            if (s_scan) {
                // FINISHED first: FINISHED <= STARTED always, so equal reads mean nothing in
                // flight; the acquire loads order the scan's reads of g after them.
                unsigned long long finished = gcd_load_acquire(cnt + GCD_FINISHED);
                seen_started = gcd_load_acquire(cnt + GCD_STARTED);
                consistent = finished == seen_started;
            }
        }
        __syncthreads();
        if (s_stop) break;

        if (s_scan) {
            gcd_block_argmax(g, alpha, C, qdiag, lo, hi, s_val, s_idx);
            if (threadIdx.x == 0) {
                if (s_idx[0] < 0 || s_val[0] < tol) {
                    s_action = ACTION_QUIET;
                    if (!greedy) picks = size - 1;  // quiet: scan again next time
                    if (consistent && gcd_load_acquire(cnt + GCD_STARTED) == seen_started) {
                        atomicExch(quiet + b, seen_started);
                        bool all = true;
                        for (int v = first_block; v < last_block && all; ++v) {
                            all = gcd_load_acquire(quiet + v) == seen_started;
                        }
                        if (all && gcd_load_acquire(cnt + GCD_STARTED) == seen_started) {
                            atomicExch(cnt + GCD_STOP, (unsigned long long)GCD_CERTIFIED);
                        }
                    }
                } else if (greedy) {
                    s_i = s_idx[0];
                }
            }
        }
        if (threadIdx.x == 0 && s_action == ACTION_UPDATE) {
            if (last_i >= 0) {  // the coordinate moved last, after the others' steps landed
                double g_now = gcd_volatile_load(g + last_i);
                eta = g_now * last_g < GCD_OVERSHOOT * last_g * last_g
                          ? fmax(0.5 * eta, GCD_ETA_MIN)
                          : fmin(1.0, GCD_ETA_GROWTH * eta);
                last_i = -1;
            }
            if (!greedy) {
                rng ^= rng >> 12;
                rng ^= rng << 25;
                rng ^= rng >> 27;
                s_i = lo + (long long)((rng * 2685821657736338717ULL) % (unsigned long long)size);
            }
            long long i = s_i;
            double a_i = gcd_volatile_load(alpha + i);
            double g_i = gcd_volatile_load(g + i);
            double delta = 0.0;
            if (greedy || gcd_projected_gradient(g_i, a_i, C[i]) >= tol) {
                delta = gcd_clip(a_i - eta * g_i / qdiag[i], C[i]) - a_i;
                if (delta == 0.0) delta = gcd_clip(a_i - g_i / qdiag[i], C[i]) - a_i;
            }
            if (delta == 0.0) {
                s_action = ACTION_SKIP;
            } else if (atomicAdd(cnt + GCD_STARTED, 1ULL) >= cap) {
                atomicExch(cnt + GCD_STOP, (unsigned long long)GCD_CAPPED);
                s_action = ACTION_STOP;
            } else {
                s_delta = delta;
                last_i = i;
                last_g = g_i;
            }
        }
        if (threadIdx.x == 0) {
            if (s_action == ACTION_QUIET) {
                __nanosleep(sleep_ns);
                sleep_ns = sleep_ns < GCD_SLEEP_MAX_NS / 2 ? 2 * sleep_ns : GCD_SLEEP_MAX_NS;
            } else if (s_action == ACTION_UPDATE) {
                sleep_ns = GCD_SLEEP_MIN_NS;
            }
        }
        __syncthreads();
        if (s_action == ACTION_STOP) break;
        if (s_action != ACTION_UPDATE) continue;

        const long long i = s_i;
        const long long il = i - base;
        const double delta = s_delta;
        const double y_i = y[i];
        for (long long j = threadIdx.x; j < n; j += blockDim.x) {
            double q_ij = use_q ? (double)Qp[il * n + j]
                                : y_i * y_p[j] *
                                      (double)gcd_kernel(XTp, sq_p, n, d, il, j, kind, gamma,
                                                         coef0, degree);
            atomicAdd(g_p + j, delta * q_ij);
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            double a_new = gcd_volatile_load(alpha + i) + delta;
            *reinterpret_cast<volatile double*>(alpha + i) = a_new;
            __threadfence();
            atomicAdd(cnt + GCD_FINISHED, 1ULL);
        }
    }
}

#ifdef GPUML_NVCC_CHECK
#define GCD_INSTANTIATE(T)                                                                   \
    template __global__ void gcd_solve<T>(                                                   \
        const T*, const T*, const T*, const double*, const double*, const double*,           \
        const long long*, const int*, const long long*, const int*, const long long*,        \
        const long long*, const unsigned long long*, const unsigned long long*, int, int, T, \
        T, int, int, double, double*, double*, unsigned long long*, unsigned long long*);
GCD_INSTANTIATE(float)
GCD_INSTANTIATE(double)
#endif
