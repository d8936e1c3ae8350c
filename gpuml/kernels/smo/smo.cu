// SMO for the kernel SVM dual with bias (You 2020, Alg 1, with LIBSVM's second-order
// working-set selection), solving many problems at once on one GPU.
//
//   min 1/2 a'Qa - e'a,  y'a = 0,  0 <= a_k <= C_k,  Q_kl = y_k y_l K(x_k, x_l)
//
// Every problem reads its kernel values from a precomputed group matrix
// (one per partition, n_g x n_g, row-major): K_kl = Kg[idx[k] * ld + idx[l]],
// so the one-vs-one problems of a partition share one matrix.
//
// smo_block: one persistent thread block per problem; the whole SMO loop runs
//            inside the block, reductions with warp shuffles and shared memory.
// smo_grid:  one problem, every block of a cooperative grid; each step's
//            reductions go block -> global scratch -> grid.sync() -> all blocks.
//
// smo_grid_rows: as smo_grid, for a problem whose kernel matrix does not fit in
//            memory: the grid computes rows i and j from the features each step.
//
// All share smo_core; the "team" type says which threads cooperate, the
// "rows" type where kernel values come from. The
// state (alpha, G) lives in global memory; a step reads G_i, G_j, alpha_i,
// alpha_j before a barrier and writes after it, so no thread sees half a step.
//
// T is the type of the kernel values (the data's float type). The state (y, C,
// alpha, G, the kernel diagonal qd) and all arithmetic on it are double for
// either T, as LIBSVM keeps float kernel rows but double gradients: a float
// gradient accumulates the rounding of every step. Every problem stops after
// max_iter steps (the host passes LIBSVM's cap for max_iter=-1) with status 1.

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

template <typename T> __device__ __forceinline__ T huge_value();
template <> __device__ __forceinline__ float huge_value<float>() { return 3.0e38f; }
template <> __device__ __forceinline__ double huge_value<double>() { return 1.0e308; }

template <typename T> __device__ __forceinline__ T tau_value() { return T(1e-12); }

// Larger value wins; on a tie the larger index (LIBSVM's ">=" picks the last).
template <typename T>
__device__ __forceinline__ void better(T& v, int& i, T ov, int oi) {
    if (ov > v || (ov == v && oi > i)) {
        v = ov;
        i = oi;
    }
}

template <typename T>
__device__ void block_argmax(T& v, int& i, T* sv, int* si) {
    for (int off = 16; off > 0; off >>= 1) {
        T ov = __shfl_down_sync(0xffffffffu, v, off);
        int oi = __shfl_down_sync(0xffffffffu, i, off);
        better(v, i, ov, oi);
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = (blockDim.x + 31) >> 5;
        v = lane < n_warps ? sv[lane] : -huge_value<T>();
        i = lane < n_warps ? si[lane] : -1;
        for (int off = 16; off > 0; off >>= 1) {
            T ov = __shfl_down_sync(0xffffffffu, v, off);
            int oi = __shfl_down_sync(0xffffffffu, i, off);
            better(v, i, ov, oi);
        }
        if (lane == 0) {
            sv[0] = v;
            si[0] = i;
        }
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
    __syncthreads();
}

template <typename T>
__device__ T block_sum(T v, T* sv) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int n_warps = (blockDim.x + 31) >> 5;
        v = lane < n_warps ? sv[lane] : T(0);
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (lane == 0) sv[0] = v;
    }
    __syncthreads();
    v = sv[0];
    __syncthreads();
    return v;
}

// The threads of one block solve one problem.
struct BlockTeam {
    double* sv;
    int* si;
    __device__ int first() const { return threadIdx.x; }
    __device__ int stride() const { return blockDim.x; }
    __device__ bool leader() const { return threadIdx.x == 0; }
    __device__ void sync() { __syncthreads(); }
    __device__ void argmax(double& v, int& i) { block_argmax(v, i, sv, si); }
    __device__ double sum(double v) { return block_sum(v, sv); }
};

// Every thread of a cooperative grid solves one problem. Partial results go
// through a double-buffered global scratch, so a reduction never overwrites
// values another block may still be reading from the previous one.
struct GridTeam {
    double* sv;
    int* si;
    double* gv;
    int* gi;
    int phase;
    __device__ int first() const { return blockIdx.x * blockDim.x + threadIdx.x; }
    __device__ int stride() const { return gridDim.x * blockDim.x; }
    __device__ bool leader() const { return blockIdx.x == 0 && threadIdx.x == 0; }
    __device__ void sync() { cg::this_grid().sync(); }
    __device__ void argmax(double& v, int& i) {
        block_argmax(v, i, sv, si);
        double* bv = gv + (phase & 1) * gridDim.x;
        int* bi = gi + (phase & 1) * gridDim.x;
        ++phase;
        if (threadIdx.x == 0) {
            bv[blockIdx.x] = v;
            bi[blockIdx.x] = i;
        }
        cg::this_grid().sync();
        v = -huge_value<double>();
        i = -1;
        for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) better(v, i, bv[b], bi[b]);
        block_argmax(v, i, sv, si);
    }
    __device__ double sum(double v) {
        v = block_sum(v, sv);
        double* bv = gv + (phase & 1) * gridDim.x;
        ++phase;
        if (threadIdx.x == 0) bv[blockIdx.x] = v;
        cg::this_grid().sync();
        v = 0.0;
        for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) v += bv[b];
        return block_sum(v, sv);
    }
};

__device__ __forceinline__ bool in_up(double y, double a, double c) {
    return y > 0 ? a < c : a > 0;
}
__device__ __forceinline__ bool in_low(double y, double a, double c) {
    return y > 0 ? a > 0 : a < c;
}

// Kernel rows from a precomputed group matrix: row i is Kg[idx[i]], column k is idx[k].
// The diagonal is gathered once into qd (prepare): read inside the selection loop it
// would be one strided, uncoalesced load from the matrix per variable and step.
template <typename T>
struct MatrixRows {
    const T* Kg;
    long long ld;
    const int* idx;
    double* qd;
    template <typename Team>
    __device__ void prepare(Team& team, int n) {
        for (int k = team.first(); k < n; k += team.stride()) {
            const long long c = idx[k];
            qd[k] = double(Kg[c * ld + c]);
        }
        team.sync();
    }
    template <typename Team>
    __device__ const T* row(Team&, int i, int) { return Kg + (long long)idx[i] * ld; }
    __device__ double at(const T* r, int k) const { return double(r[idx[k]]); }
    __device__ double diag(int k) const { return qd[k]; }
};

// Kernel rows computed when needed (the matrix does not fit): the team writes row i
// into one of two scratch rows from the features, stored transposed (XT[t * n + k])
// so that neighbouring threads read neighbouring samples.
// kind: 0 linear, 1 poly, 2 rbf, 3 sigmoid (gpuml.pairwise's formulas).
template <typename T>
struct OnTheFlyRows {
    const T* XT;
    const T* norms;
    const double* qd;
    T* scratch;
    int n;
    int d;
    int kind;
    T gamma;
    T coef0;
    int degree;
    __device__ T value(int i, int k) const {
        T dot = 0;
        for (int t = 0; t < d; ++t) dot += XT[(long long)t * n + i] * XT[(long long)t * n + k];
        if (kind == 0) return dot;
        if (kind == 1) {
            const T base = gamma * dot + coef0;
            T out = 1;
            for (int t = 0; t < degree; ++t) out *= base;
            return out;
        }
        if (kind == 2) {
            T d2 = norms[i] + norms[k] - T(2) * dot;
            if (d2 < 0) d2 = 0;
            return exp(-gamma * d2);
        }
        return tanh(gamma * dot + coef0);
    }
    template <typename Team>
    __device__ void prepare(Team&, int) {}
    template <typename Team>
    __device__ const T* row(Team& team, int i, int slot) {
        T* out = scratch + (long long)slot * n;
        for (int k = team.first(); k < n; k += team.stride()) out[k] = value(i, k);
        team.sync();
        return out;
    }
    __device__ double at(const T* r, int k) const { return double(r[k]); }
    __device__ double diag(int k) const { return qd[k]; }
};

template <typename Team, typename Rows>
__device__ void smo_core(Team& team, Rows& rows, int n, const double* y, const double* C,
                         double* alpha, double* G, double tol, long long max_iter,
                         long long* n_iter_out, double* rho_out, double* obj_out,
                         int* status_out) {
    rows.prepare(team, n);
    long long it = 0;
    int status = 1;
    while (it < max_iter) {
        double g_max = -huge_value<double>();
        int i = -1;
        for (int k = team.first(); k < n; k += team.stride()) {
            if (in_up(y[k], alpha[k], C[k])) better(g_max, i, -y[k] * G[k], k);
        }
        team.argmax(g_max, i);
        if (i < 0) {
            status = 0;
            break;
        }
        const auto* Ki = rows.row(team, i, 0);
        const double qd_i = rows.diag(i);
        double g_max2 = -huge_value<double>();
        int unused = -1;
        double best = -huge_value<double>();
        int j = -1;
        for (int k = team.first(); k < n; k += team.stride()) {
            if (!in_low(y[k], alpha[k], C[k])) continue;
            const double v = y[k] * G[k];
            if (v > g_max2) g_max2 = v;
            const double diff = g_max + v;
            if (diff > 0) {
                double quad = qd_i + rows.diag(k) - 2.0 * rows.at(Ki, k);
                if (quad <= 0) quad = tau_value<double>();
                better(best, j, diff * diff / quad, k);
            }
        }
        team.argmax(g_max2, unused);
        team.argmax(best, j);
        if (g_max + g_max2 < tol || j < 0) {
            status = 0;
            break;
        }
        // Everyone computes the same step from values read before the barrier.
        const auto* Kj = rows.row(team, j, 1);
        const double yi = y[i], yj = y[j], Ci = C[i], Cj = C[j];
        const double old_i = alpha[i], old_j = alpha[j];
        double quad = qd_i + rows.diag(j) - 2.0 * rows.at(Ki, j);
        if (quad <= 0) quad = tau_value<double>();
        double ai = old_i, aj = old_j;
        if (yi != yj) {
            const double delta = (-G[i] - G[j]) / quad;
            const double diff = ai - aj;
            ai += delta;
            aj += delta;
            if (diff > 0) {
                if (aj < 0) { aj = 0; ai = diff; }
            } else if (ai < 0) {
                ai = 0; aj = -diff;
            }
            if (diff > Ci - Cj) {
                if (ai > Ci) { ai = Ci; aj = Ci - diff; }
            } else if (aj > Cj) {
                aj = Cj; ai = Cj + diff;
            }
        } else {
            const double delta = (G[i] - G[j]) / quad;
            const double total = ai + aj;
            ai -= delta;
            aj += delta;
            if (total > Ci) {
                if (ai > Ci) { ai = Ci; aj = total - Ci; }
            } else if (aj < 0) {
                aj = 0; ai = total;
            }
            if (total > Cj) {
                if (aj > Cj) { aj = Cj; ai = total - Cj; }
            } else if (ai < 0) {
                ai = 0; aj = total;
            }
        }
        team.sync();
        if (team.leader()) {
            alpha[i] = ai;
            alpha[j] = aj;
        }
        const double di = (ai - old_i) * yi;
        const double dj = (aj - old_j) * yj;
        for (int k = team.first(); k < n; k += team.stride()) {
            G[k] += y[k] * (rows.at(Ki, k) * di + rows.at(Kj, k) * dj);
        }
        team.sync();
        ++it;
    }
    // LIBSVM's rho: mean of yG over free variables, else the middle of its bounds.
    double free_sum = 0, free_count = 0, objective = 0;
    double ub = -huge_value<double>(), lb = -huge_value<double>();  // ub: -min(...) as a max
    int unused = -1;
    for (int k = team.first(); k < n; k += team.stride()) {
        const double yg = y[k] * G[k];
        const double a = alpha[k];
        objective += a * (G[k] - 1.0);
        const bool upper = a >= C[k];
        const bool lower = a <= 0;
        if (upper || lower) {
            if ((upper && y[k] < 0) || (lower && y[k] > 0)) {
                if (-yg > ub) ub = -yg;
            } else if (yg > lb) {
                lb = yg;
            }
        } else {
            free_sum += yg;
            free_count += 1;
        }
    }
    free_sum = team.sum(free_sum);
    free_count = team.sum(free_count);
    objective = team.sum(objective);
    team.argmax(ub, unused);
    team.argmax(lb, unused);
    if (team.leader()) {
        *rho_out = free_count > 0 ? free_sum / free_count : (lb - ub) / 2.0;
        *obj_out = objective / 2.0;
        *n_iter_out = it;
        *status_out = status;
    }
}

// Problem p: rows idx[off[p] : off[p] + size[p]] of the group matrix at K + k_off[p]
// with leading dimension ld[p]; y, C, alpha, G and qd (the diagonal, filled here) are
// concatenated the same way; problem p stops after max_iter[p] steps.
template <typename T>
__global__ void smo_block(const T* K, const long long* k_off, const long long* ld,
                          const int* idx, const long long* off, const int* size,
                          const double* y, const double* C, double* alpha, double* G,
                          double* qd, double tol, const long long* max_iter, long long* n_iter,
                          double* rho, double* obj, int* status) {
    __shared__ double sv[32];
    __shared__ int si[32];
    const int p = blockIdx.x;
    const long long o = off[p];
    BlockTeam team{sv, si};
    MatrixRows<T> rows{K + k_off[p], ld[p], idx + o, qd + o};
    smo_core(team, rows, size[p], y + o, C + o, alpha + o, G + o, tol, max_iter[p], n_iter + p,
             rho + p, obj + p, status + p);
}

// One problem over the whole cooperative grid; scratch_v/scratch_i hold 2 * gridDim values.
template <typename T>
__global__ void smo_grid(const T* K, long long ld, const int* idx, int n, const double* y,
                         const double* C, double* alpha, double* G, double* qd, double tol,
                         long long max_iter, double* scratch_v, int* scratch_i,
                         long long* n_iter, double* rho, double* obj, int* status) {
    __shared__ double sv[32];
    __shared__ int si[32];
    GridTeam team{sv, si, scratch_v, scratch_i, 0};
    MatrixRows<T> rows{K, ld, idx, qd};
    smo_core(team, rows, n, y, C, alpha, G, tol, max_iter, n_iter, rho, obj, status);
}

// XT: (d, n) features, transposed; norms, qd: squared norms and K(x_k, x_k); row_scratch: 2 n.
template <typename T>
__global__ void smo_grid_rows(const T* XT, const T* norms, const double* qd, int n, int d,
                              int kind, T gamma, T coef0, int degree, const double* y,
                              const double* C, double* alpha, double* G, double tol,
                              long long max_iter, double* scratch_v, int* scratch_i,
                              T* row_scratch, long long* n_iter, double* rho, double* obj,
                              int* status) {
    __shared__ double sv[32];
    __shared__ int si[32];
    GridTeam team{sv, si, scratch_v, scratch_i, 0};
    OnTheFlyRows<T> rows{XT, norms, qd, row_scratch, n, d, kind, gamma, coef0, degree};
    smo_core(team, rows, n, y, C, alpha, G, tol, max_iter, n_iter, rho, obj, status);
}

#ifdef GPUML_NVCC_CHECK
#define GPUML_SMO_INSTANCES(T)                                                                \
    template __global__ void smo_block<T>(const T*, const long long*, const long long*,       \
                                          const int*, const long long*, const int*,           \
                                          const double*, const double*, double*, double*,     \
                                          double*, double, const long long*, long long*,      \
                                          double*, double*, int*);                            \
    template __global__ void smo_grid<T>(const T*, long long, const int*, int, const double*, \
                                         const double*, double*, double*, double*, double,    \
                                         long long, double*, int*, long long*, double*,       \
                                         double*, int*);                                      \
    template __global__ void smo_grid_rows<T>(const T*, const T*, const double*, int, int,    \
                                              int, T, T, int, const double*, const double*,   \
                                              double*, double*, double, long long, double*,   \
                                              int*, T*, long long*, double*, double*, int*);
GPUML_SMO_INSTANCES(float)
GPUML_SMO_INSTANCES(double)
#endif
